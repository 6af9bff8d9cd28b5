"""Both backends, for real, serving the shipped squares (points, under /points) and dates (tokens, under /tokens)
models, set up once for the module and torn down at its end: the one-process server (uvicorn in a thread of this
process, on a free 127.0.0.1 port) and Ray Serve (a local Ray, 2 CPUs, no dashboard; dates on two replicas).
Requests go through HTTP (httpx); on Ray also through deployment handles, and a replica is killed."""
from __future__ import annotations

import json
import re
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import ray
from ray import serve

from runtime.errors import InputError
from runtime.model import Seq2Seq
from serving.app import build_app
from serving.config import Replicas, ServeConfig

from support.serve import DATES, SQUARES, embedded, free_port, local_ray

SCORE_RTOL = 1e-5  # merged batches may round a log-prob differently in the last float32 bits
POINT_TOL = 1e-6
MAX_BODY = 64 << 10
MAX_BATCH = 16
SERVE_TIMEOUT_S = 30  # Serve's own request timeout on the Ray fixture (its proxy answers 408 past it)
TEXTS = ["march 3 1999", "3/3/15", "tuesday, march 3 2015", "12 dec 2001", "1/2/03", "july 4, 1776",
         "saturday, january 1 2000", "5.6.07"]


COMMON = dict(num_cpus=0.25, batch_wait_ms=50.0, max_batch_size=MAX_BATCH, max_body_bytes=MAX_BODY)


@dataclass
class Served:
    url: str
    client: httpx.Client
    backend: str


@pytest.fixture(scope="module")
def on_ray() -> Iterator[Served]:
    """Both models deployed on Ray Serve; batches wait 50 ms so that concurrent requests meet."""
    with local_ray():
        port = free_port()  # after Ray has taken its own ports
        serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": SERVE_TIMEOUT_S})
        serve.run(build_app(SQUARES, ServeConfig(**COMMON)), name="points", route_prefix="/points")
        serve.run(build_app(DATES, ServeConfig(**COMMON, replicas=Replicas(2, 2))), name="tokens",
                  route_prefix="/tokens")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield Served(f"http://127.0.0.1:{port}", client, "ray")


@pytest.fixture(scope="module")
def here() -> Iterator[Served]:
    """Both models on the one-process server; batches wait 50 ms so that concurrent requests meet."""
    port = free_port()
    with embedded({"/points": (SQUARES, ServeConfig(**COMMON)), "/tokens": (DATES, ServeConfig(**COMMON))}, port):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield Served(f"http://127.0.0.1:{port}", client, "embedded")


@pytest.fixture(scope="module", params=["embedded", pytest.param("ray", marks=pytest.mark.ray)])
def served(request: pytest.FixtureRequest) -> Served:
    """Each backend in turn."""
    return request.getfixturevalue("here" if request.param == "embedded" else "on_ray")


@pytest.fixture(scope="module")
def squares() -> Seq2Seq:
    return Seq2Seq.load(SQUARES, threads=1)


@pytest.fixture(scope="module")
def dates() -> Seq2Seq:
    return Seq2Seq.load(DATES, threads=1)


def sources(count: int, seed: int = 0) -> list[np.ndarray]:
    """Point sources of lengths 1..count, one item each."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, (1, length, 2)).astype(np.float32) for length in range(1, count + 1)]


def assert_same_translations(got: list[list[dict]], want: list[list[Any]]) -> None:
    assert [[h["ids"] for h in hyps] for hyps in got] == [[h.ids for h in hyps] for hyps in want]
    assert [[h["text"] for h in hyps] for hyps in got] == [[h.text for h in hyps] for hyps in want]
    np.testing.assert_allclose([h["score"] for hyps in got for h in hyps], [h.score for hyps in want for h in hyps],
                               rtol=SCORE_RTOL)


def test_model_info_health_and_docs(served: Served, dates: Seq2Seq) -> None:
    info = served.client.get("/tokens/v1/model").json()
    assert info["kind"] == "tokens" and info["export_id"] == dates.manifest.export_id
    assert info["precision"] == "fp32"
    assert info["vocabulary_size"] == {"source": len(dates.vocabularies["source"]),
                                       "target": len(dates.vocabularies["target"])}
    assert info["providers"][0] == "CPUExecutionProvider" and info["threads"] == 1
    assert info["max_batch_size"] == MAX_BATCH and info["spec"]["target_len"] == dates.spec.target_len
    assert (info["max_decoding_length"], info["max_beam_size"]) == (512, 16)  # the defaults: COMMON sets neither
    assert served.client.get("/points/v1/model").json()["max_beam_size"] is None  # a point model has no beams
    assert served.client.get("/points/healthz").json()["status"] == "ok"
    schemas = served.client.get("/tokens/openapi.json").json()["components"]["schemas"]
    assert {"TranslateRequest", "TranslateResponse", "PredictRequest", "ErrorBody"} <= set(schemas)
    beam = schemas["TranslateRequest"]["properties"]["beam_size"]
    assert beam["minimum"] == 1 and "max_beam_size" in beam["description"]  # the bound a client reads in /v1/model
    assert served.client.get("/tokens/docs").status_code == 200


def test_http_predict_equals_in_process(served: Served, squares: Seq2Seq) -> None:
    source = np.array([[[-1, -1], [-1, 1], [0.5, 0.5]], [[1, 1], [1, -1], [0, 0]]], dtype=np.float32)
    mask = [[1, 1, 1], [1, 1, 0]]
    reply = served.client.post("/points/v1/predict", json={"source": source.tolist(), "source_mask": mask,
                                                           "target_len": 3, "return_attention": True})
    assert reply.status_code == 200, reply.text
    want, alphas = squares.predict(source, target_len=3, source_mask=np.array(mask), return_attention=True)
    np.testing.assert_allclose(reply.json()["outputs"], want, rtol=POINT_TOL, atol=POINT_TOL)
    np.testing.assert_allclose(reply.json()["attention"], alphas, rtol=POINT_TOL, atol=POINT_TOL)
    assert reply.json()["export_id"] == squares.manifest.export_id
    # the (N, 1, L) mask the Python API and infer take (HTTP refused it: its schema had only (N, L))
    three_d = served.client.post("/points/v1/predict", json={"source": source.tolist(), "target_len": 3,
                                                             "source_mask": [[[True, True, True]], [[True, True, False]]]})
    assert three_d.status_code == 200 and three_d.json()["outputs"] == reply.json()["outputs"], three_d.text


def test_an_empty_batch_is_answered_empty_on_both_routes(served: Served) -> None:
    """{"texts": []} was 200 and {"source": []} 400 ('got shape (0,)': JSON's [] has no inner shape to read)."""
    texts = served.client.post("/tokens/v1/translate", json={"texts": []})
    points = served.client.post("/points/v1/predict", json={"source": [], "source_mask": [],
                                                            "return_attention": True})
    assert (texts.status_code, points.status_code) == (200, 200), (texts.text, points.text)
    assert texts.json()["translations"] == [] and points.json()["outputs"] == [] == points.json()["attention"]


@pytest.mark.parametrize("options", [{}, {"beam_size": 4, "num_hypotheses": 2, "return_attention": True},
                                     {"max_decoding_length": 6, "min_decoding_length": 3},
                                     {"sampling_topk": 5, "sampling_temperature": 1.5, "seed": 7},
                                     {"beam_size": 4, "sampling_temperature": 0.5, "sampling_topp": 0.3}],
                         ids=["greedy", "beam-nbest-attention", "lengths", "sampling", "beam-top-p-at-top-k-1"])
def test_http_translate_equals_in_process(served: Served, dates: Seq2Seq, options: dict) -> None:
    reply = served.client.post("/tokens/v1/translate", json={"texts": TEXTS[:3], **options})
    assert reply.status_code == 200, reply.text
    want = dates.translate_batch(TEXTS[:3], **options)
    assert_same_translations(reply.json()["translations"], want)
    if options.get("return_attention"):
        got = reply.json()["translations"][0][0]["attention"]
        np.testing.assert_allclose(got, want[0][0].attention, rtol=1e-5, atol=1e-6)


@pytest.mark.ray
def test_deployment_handles_equal_http(on_ray: Served, dates: Seq2Seq, squares: Seq2Seq) -> None:
    found = serve.get_app_handle("tokens").translate.remote(TEXTS[:2], beam_size=3).result(timeout_s=30)
    assert_same_translations(found, dates.translate_batch(TEXTS[:2], beam_size=3))
    source = [[[-1.0, -1.0], [-1.0, 1.0]]]
    body = serve.get_app_handle("points").predict.remote(source, return_attention=True).result(timeout_s=30)
    np.testing.assert_allclose(body["outputs"], squares.predict(source), rtol=POINT_TOL, atol=POINT_TOL)


MERGE_TRIES = 3  # a loaded machine can spread one burst past the 50 ms batch wait; a second burst rarely is


def _concurrently(served: Served, path: str, bodies: list[dict]) -> list[httpx.Response]:
    """All bodies posted at once, one thread each; the burst again (up to MERGE_TRIES) until some requests met
    in one batch."""
    for _ in range(MERGE_TRIES):
        barrier = threading.Barrier(len(bodies))

        def post(body: dict, barrier: threading.Barrier = barrier) -> httpx.Response:
            barrier.wait()
            return served.client.post(path, json=body)

        with ThreadPoolExecutor(len(bodies)) as pool:
            replies = list(pool.map(post, bodies))
        if any(int(r.headers.get("x-seq2onnx-batch-requests", "1")) > 1 for r in replies):
            break
    return replies


def test_concurrent_points_batch_and_match_one_at_a_time(served: Served, squares: Seq2Seq) -> None:
    items = sources(8)  # lengths 1..8: merged batches pad and mask, then cut the attention back
    replies = _concurrently(served, "/points/v1/predict",
                            [{"source": s.tolist(), "return_attention": True} for s in items])
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert max(int(r.headers["x-seq2onnx-batch-requests"]) for r in replies) > 1
    for item, reply in zip(items, replies):
        want, alphas = squares.predict(item, return_attention=True)
        np.testing.assert_allclose(reply.json()["outputs"], want, rtol=POINT_TOL, atol=POINT_TOL)
        assert np.asarray(reply.json()["attention"]).shape == alphas.shape
        np.testing.assert_allclose(reply.json()["attention"], alphas, rtol=POINT_TOL, atol=POINT_TOL)


def test_concurrent_texts_batch_and_match_one_at_a_time(served: Served, dates: Seq2Seq) -> None:
    options = [{}, {"beam_size": 3}] * 4  # two option sets: each decodes in its own merged group
    bodies = [{"texts": [text], **option} for text, option in zip(TEXTS, options)]
    replies = _concurrently(served, "/tokens/v1/translate", bodies)
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert max(int(r.headers["x-seq2onnx-batch-requests"]) for r in replies) > 1
    for body, reply in zip(bodies, replies):
        want = dates.translate_batch(body["texts"], **{k: v for k, v in body.items() if k != "texts"})
        assert_same_translations(reply.json()["translations"], want)


@pytest.mark.ray
def test_two_replicas_both_serve(on_ray: Served) -> None:
    seen = set()
    for _ in range(60):
        reply = on_ray.client.post("/tokens/v1/translate", json={"texts": ["3/3/15"]})
        seen.add(reply.headers["x-seq2onnx-replica"])
        if len(seen) == 2:
            break
    assert len(seen) == 2


BAD_REQUESTS = {
    "texts not a list": ("/tokens/v1/translate", {"texts": "3/3/15"}, 422, "texts"),
    "text not a string": ("/tokens/v1/translate", {"texts": [3]}, 422, "texts[0]"),
    "missing texts": ("/tokens/v1/translate", {"beam_size": 2}, 422, "texts: field required"),
    "unknown option": ("/tokens/v1/translate", {"texts": ["a"], "beam": 2}, 422, "beam: extra inputs"),
    "beam size a string": ("/tokens/v1/translate", {"texts": ["a"], "beam_size": "2"}, 422, "beam_size"),
    "beam size 0": ("/tokens/v1/translate", {"texts": ["a"], "beam_size": 0}, 400,
                    "beam_size: expected an int in [1, 16] on this server, got 0"),  # not the runtime's 256
    "beam size over the bound": ("/tokens/v1/translate", {"texts": ["a"], "beam_size": 17}, 400,
                                 "beam_size: at most 16 on this server (serve --max-beam-size), got 17"),
    "n-best above beam": ("/tokens/v1/translate", {"texts": ["a"], "beam_size": 2, "num_hypotheses": 3}, 400,
                          "num_hypotheses"),
    "sampling with beam": ("/tokens/v1/translate", {"texts": ["a"], "beam_size": 2, "sampling_topk": 3}, 400,
                           "sampling"),
    "blank text": ("/tokens/v1/translate", {"texts": ["  "]}, 400, "texts[0]"),
    "lone surrogate": ("/tokens/v1/translate", ("application/json", b'{"texts": ["3/3/15", "a\\ud800b"]}'), 400,
                       "texts[1]: expected Unicode text, got a lone surrogate U+D800"),
    "body not UTF-8": ("/tokens/v1/translate", ("application/json", b'{"texts": ["caf\xe9"]}'), 422,
                       "the body is not UTF-8 (byte 0xe9 at offset 15)"),
    "body in UTF-16": ("/tokens/v1/translate", ("application/json", '{"texts": ["3/3/15"]}'.encode("utf-16")), 422,
                       "the body is not UTF-8 (byte 0xff at offset 0)"),  # json.loads took it
    "a JSON string body": ("/tokens/v1/translate", b'"3/3/15"', 422, 'body: input should be a valid dictionary'),
    "text too long": ("/tokens/v1/translate", {"texts": ["1" * 3000]}, 400, "texts[0]"),
    "too many texts": ("/tokens/v1/translate", {"texts": ["3/3/15"] * (MAX_BATCH + 1)}, 413, "--max-batch-size"),
    # the route to use, as the client spells it: under the server's prefix (here each model's mount or Serve prefix)
    "points to a token model": ("/tokens/v1/predict", {"source": [[[1.0, 2.0]]]}, 400, "to /tokens/v1/translate"),
    "texts to a point model": ("/points/v1/translate", {"texts": ["3/3/15"]}, 400, "to /points/v1/predict"),
    "texts to a token model's predict": ("/tokens/v1/predict", {"texts": ["3/3/15"]}, 400,
                                         "POST {\"texts\": [...]} to /tokens/v1/translate"),
    "points to a point model's translate": ("/points/v1/translate", {"source": [[[1.0, 2.0]]]}, 400,
                                            "to /points/v1/predict"),
    # the other kind's input on the model's own route's twin: what the model takes (a plain 422 before)
    "texts to a point model's predict": ("/points/v1/predict", {"texts": ["3/3/15"]}, 400,
                                         "texts: this server's model is a point model, which takes numeric sources; "
                                         "POST {\"source\": [[[x, y], ...]]} to /points/v1/predict"),
    "points to a token model's translate": ("/tokens/v1/translate", {"source": [[[1.0, 2.0]]]}, 400,
                                            "source: this server's model is a token model, which takes texts; POST "
                                            "{\"texts\": [...]} to /tokens/v1/translate"),
    "ragged source": ("/points/v1/predict", {"source": [[[1.0, 2.0]], [[1.0, 2.0], [3.0, 4.0]]]}, 400, "source"),
    "wrong feature count": ("/points/v1/predict", {"source": [[[1.0, 2.0, 3.0]]]}, 400, "source"),
    "NaN point": ("/points/v1/predict", b'{"source": [[[NaN, 1.0]]]}', 400, "finite"),
    "1e400 point": ("/points/v1/predict", b'{"source": [[[1e400, 1.0]]]}', 422, "1e400 is too large for any float"),
    "1e400 option": ("/tokens/v1/translate", b'{"texts": ["a"], "length_penalty": -1e400}', 422,
                     "-1e400 is too large for any float"),
    "a repeated key": ("/tokens/v1/translate", b'{"texts": ["3/3/15"], "beam_size": 2, "texts": ["a"]}', 422,
                       "the key(s) ['texts'] more than once"),
    "a repeated key inside": ("/points/v1/predict", b'{"source": [[[1.0, 2.0]]], "source_mask": null, '
                              b'"target_len": 2, "target_len": 3}', 422, "['target_len'] more than once"),
    "point a string": ("/points/v1/predict", {"source": [[["a", 1.0]]]}, 422, "source[0][0][0]"),
    "mask of 2": ("/points/v1/predict", {"source": [[[1.0, 2.0]]], "source_mask": [[2]]}, 400, "source_mask"),
    "mask of another length": ("/points/v1/predict", {"source": [[[1.0, 2.0]]], "source_mask": [[1, 1, 1]]}, 400,
                               "source_mask: expected shape (1, 1) or (1, 1, 1) to match source, got"),
    "mask of words": ("/points/v1/predict", {"source": [[[1.0, 2.0]]], "source_mask": [["yes"]]}, 400,
                      "source_mask: expected bool or 0/1 numbers"),  # one message, not one per type it is not
    "mask left-padded": ("/points/v1/predict", {"source": [[[1.0, 2.0], [3.0, 4.0]]], "source_mask": [[0, 1]]},
                         400, "right-padded"),
    "target_len 0": ("/points/v1/predict", {"source": [[[1.0, 2.0]]], "target_len": 0}, 400,
                     "target_len: expected an int in [1, 512] on this server, got 0"),  # not the runtime's 10000
    "max_decoding_length 0": ("/tokens/v1/translate", {"texts": ["a"], "max_decoding_length": 0}, 400,
                              "max_decoding_length: expected an int in [1, 512] on this server, got 0"),
    "min_decoding_length -1": ("/tokens/v1/translate", {"texts": ["a"], "min_decoding_length": -1}, 400,
                               "min_decoding_length: expected an int in [0, 512] on this server, got -1"),
    "max_decoding_length over the bound": ("/tokens/v1/translate", {"texts": ["a"], "beam_size": 5,
                                                                   "max_decoding_length": 50_000}, 400,
                                           "--max-decoding-length"),
    "min_decoding_length over the bound": ("/tokens/v1/translate", {"texts": ["a"], "min_decoding_length": 600},
                                           400, "--max-decoding-length"),
    "min_decoding_length over the model's length": ("/tokens/v1/translate", {"texts": ["a"], "min_decoding_length": 300},
                                                    400, "pass max_decoding_length >= 300 too (at most 512)"),
    "min_decoding_length over the model's length, max_decoding_length null":
        ("/tokens/v1/translate", {"texts": ["a"], "min_decoding_length": 511, "max_decoding_length": None}, 400,
         "pass max_decoding_length >= 511 too (at most 512)"),
    "target_len over the bound": ("/points/v1/predict", {"source": [[[1.0, 2.0]]], "target_len": 5000}, 400,
                                  "--max-decoding-length"),
    "length_penalty 1000": ("/tokens/v1/translate", {"texts": ["a"], "beam_size": 2, "length_penalty": 1000.0}, 400,
                            "length_penalty"),
    "plain-text body": ("/tokens/v1/translate", ("text/plain", b'{"texts": ["3/3/15"]}'), 422,
                        'Content-Type: application/json, got Content-Type: "text/plain"'),
    "GET on a POST route": ("/tokens/v1/translate", "GET", 405, "GET /tokens/v1/translate"),
    # a token model's own POST route only (the other answers 400), /openapi.json too
    "unknown route": ("/tokens/v2/translate", {"texts": ["a"]}, 404, "the routes are POST /tokens/v1/translate, "
                      "GET/HEAD /tokens/v1/model, GET/HEAD /tokens/healthz, GET/HEAD /tokens/readyz, GET/HEAD "
                      "/tokens/metrics, GET/HEAD /tokens/docs, GET/HEAD /tokens/redoc, GET/HEAD "
                      "/tokens/openapi.json"),
    "unknown route of a point model": ("/points/v1/nothing", {"source": [[[1.0, 2.0]]]}, 404,
                                       "the routes are POST /points/v1/predict, GET/HEAD /points/v1/model"),
    "a route with a trailing slash": ("/tokens/v1/translate/", {"texts": ["a"]}, 404,
                                      "POST /tokens/v1/translate/: not found; the routes are"),
    "a gzip body": ("/tokens/v1/translate", ("application/json", b"\x1f\x8b\x08\x00", [("content-encoding", "gzip")]),
                    415, "Content-Encoding 'gzip': this server reads only uncompressed bodies"),
    "a JSON body said to be br": ("/tokens/v1/translate", ("application/json", b'{"texts": ["3/3/15"]}',
                                                           [("content-encoding", "BR")]), 415, "Content-Encoding 'br'"),
    "a JSON body said to be gzip, then identity": ("/points/v1/predict", ("application/json",
                                                                         b'{"source": [[[1.0, 2.0]]]}',
                                                                         [("content-encoding", "gzip"),
                                                                          ("content-encoding", "identity")]),
                                                   415, "Content-Encoding 'gzip'"),
    "a 401-digit integer option": ("/tokens/v1/translate", b'{"texts": ["a"], "beam_size": 1' + b"0" * 400 + b"}", 422,
                                   "(401 characters) is too large for any float"),
    "a 401-digit integer point": ("/points/v1/predict", b'{"source": [[[1' + b"0" * 400 + b', 1.0]]]}', 422,
                                  "(401 characters) is too large for any float"),
    "not JSON": ("/points/v1/predict", b"{not json", 422, "not valid JSON"),
    "an empty body": ("/tokens/v1/translate", b"", 422, "body: expected a JSON object (the route's schema: /docs), "
                      "got an empty body"),
    "a 5000-digit integer": ("/tokens/v1/translate", b'{"texts": ["a"], "beam_size": ' + b"9" * 5000 + b"}", 422,
                             "has more digits than the 4300 read here"),
    "texts nested past the recursion limit": ("/tokens/v1/translate", b'{"texts": ' + b"[" * 20_000 + b"]" * 20_000
                                              + b"}", 422, "the body is JSON nested too deeply to parse"),
    "a source nested past the recursion limit": ("/points/v1/predict", b'{"source": ' + b"[" * 20_000
                                                 + b"]" * 20_000 + b"}", 422, "nested too deeply"),
    "oversized body": ("/points/v1/predict", b"[" + b"1," * MAX_BODY + b"1]", 413, "--max-body-bytes"),
    # FastAPI ignores a query it does not declare: the text was decoded greedily, as if no option were given
    "options in the query string": ("/tokens/v1/translate?beam_size=5", {"texts": ["3/3/15"]}, 422,
                                    "POST /tokens/v1/translate: the query string is not read (got 'beam_size=5'); a "
                                    "decode's options go in the JSON body beside its input, e.g. {\"texts\": [...], "
                                    "\"beam_size\": 5}"),
    "a point model's options in the query string": ("/points/v1/predict?target_len=3", {"source": [[[1.0, 2.0]]]},
                                                    422, "(got 'target_len=3'); a decode's options go in the JSON "
                                                    "body beside its input, e.g. {\"source\": [...], "
                                                    "\"target_len\": 20}"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_requests_get_4xx_with_one_line(served: Served, name: str) -> None:
    path, body, status, says = BAD_REQUESTS[name]
    if body == "GET":
        reply = served.client.get(path)
    elif isinstance(body, tuple):  # (content type, raw body[, more (name, value) headers])
        headers = [("content-type", body[0]), *(body[2] if len(body) > 2 else [])]
        reply = served.client.post(path, content=body[1], headers=headers)
    elif isinstance(body, bytes):
        reply = served.client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        reply = served.client.post(path, json=body)
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]
    assert says in message and "\n" not in message and "Traceback" not in message
    assert served.client.get(path.split("/v")[0] + "/healthz").status_code == 200


@pytest.mark.parametrize("name", ["1e400 point", "a repeated key"])
def test_streamed_body_is_read_as_strictly(served: Served, name: str) -> None:
    """A body without Content-Length goes to FastAPI's own parsing (the front answers declared lengths only): it
    refuses what the front refuses."""
    path, body, status, says = BAD_REQUESTS[name]
    reply = served.client.post(path, content=iter([body[:5], body[5:]]), headers={"content-type": "application/json"})
    assert "content-length" not in reply.request.headers
    assert reply.status_code == status and says in reply.json()["error"], reply.text


def test_a_content_encoding_on_a_get_changes_nothing(served: Served) -> None:
    reply = served.client.get("/tokens/healthz", headers={"content-encoding": "gzip"})
    assert reply.status_code == 200, reply.text


def test_streamed_oversized_body_is_refused(served: Served) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts as the body arrives
        yield b'{"texts": ["'
        for _ in range(MAX_BODY // 1024 + 1):
            yield b"1" * 1024
        yield b'"]}'

    reply = served.client.post("/tokens/v1/translate", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413 and "--max-body-bytes" in reply.json()["error"]


def _replica_actors(app: str) -> list[str]:
    return sorted(actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)
                  if actor["name"].startswith(f"SERVE_REPLICA::{app}#"))


def _running_replicas(app: str) -> int:
    deployment = serve.status().applications[app].deployments["Seq2SeqService"]
    return deployment.replica_states.get("RUNNING", 0)


def _replaced(app: str, before: list[str]) -> bool:
    """Two replicas running, one of them new, and none of those killed."""
    now = _replica_actors(app)
    return len(set(now) - set(before)) == 1 and len(now) == 2 and _running_replicas(app) == 2


@pytest.mark.ray
def test_killed_replica_is_replaced_and_no_request_hangs(on_ray: Served) -> None:
    """Four clients post for ~6 s while one of the two replicas is killed: every request ends with a status (200, or
    an error status with a body) before the client gives up, and Serve brings the deployment back to two serving
    replicas.

    A request under way on the killed replica mostly gets Serve's 500 at once. Ray sometimes loses one instead (1 kill
    of 15 with a core kept busy, a request sent ~30 ms before the kill); Serve's proxy then answers it 408 at its own
    request timeout. So the clients wait past that timeout: a request with no answer then is a hang."""
    before = _replica_actors("tokens")
    assert len(before) == 2
    outcomes: list[Any] = []
    stop = time.monotonic() + 6

    def client() -> None:
        with httpx.Client(base_url=on_ray.url, timeout=SERVE_TIMEOUT_S + 15) as own:
            for _ in range(300):
                if time.monotonic() > stop:
                    return
                try:
                    reply = own.post("/tokens/v1/translate", json={"texts": ["march 3 1999"]})
                    outcomes.append((reply.status_code, reply.text))
                except httpx.HTTPError as exc:  # a timeout would be a hang: recorded, then failed below
                    outcomes.append((type(exc).__name__, str(exc)))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 5
    while len(outcomes) < 4 and time.monotonic() < deadline:  # requests under way before the kill
        time.sleep(0.05)
    ray.kill(ray.get_actor(before[0], namespace="serve"), no_restart=True)
    for thread in threads:
        thread.join(timeout=2 * SERVE_TIMEOUT_S + 30)
    assert not any(thread.is_alive() for thread in threads)
    statuses = [status for status, _ in outcomes]
    assert all(isinstance(s, int) for s in statuses), [o for o in outcomes if not isinstance(o[0], int)][:3]
    assert statuses.count(200) > 10
    lost = f"timed out after {float(SERVE_TIMEOUT_S)}s"  # Serve's answer to a request Ray lost with the replica
    assert all(s == 200 or (s >= 500 and text) or (s == 408 and lost in text) for s, text in outcomes), \
        [o for o in outcomes if o[0] != 200][:3]
    # Serve notices the dead replica by its health check, then starts another. Until it notices, its status still
    # counts the dead one as RUNNING, so wait for a replica that was not there before, and for it to run.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not _replaced("tokens", before):
        time.sleep(1)
    status = serve.status().applications["tokens"].deployments["Seq2SeqService"]
    assert _replaced("tokens", before), (status.status, status.message, status.replica_states,
                                         _replica_actors("tokens"))
    seen: set[str] = set()
    deadline = time.monotonic() + 30  # the proxy learns of the new replica shortly after Serve reports it
    while len(seen) < 2 and time.monotonic() < deadline:
        reply = on_ray.client.post("/tokens/v1/translate", json={"texts": ["3/3/15"]})
        assert reply.status_code == 200
        seen.add(reply.headers["x-seq2onnx-replica"])
        time.sleep(0.05)
    assert len(seen) == 2 and before[0].rsplit("#", 1)[-1] not in seen
    print(f"during the kill: {statuses.count(200)} of {len(statuses)} requests 200, others {set(statuses) - {200}}")


def test_runtime_never_imports_ray() -> None:
    """The runtime (and the CLI's group and infer) loads neither Ray nor the serving package; cli.serve loads no Ray
    until a command runs; the one-process server (app, service, uvicorn) loads no Ray at all."""
    import subprocess
    import sys

    code = ("import json, sys, runtime, runtime.model, cli.main, cli.infer; "
            "first = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'serving', 'pyarrow', 'fastapi')); "
            "import cli.serve; "
            "then = sorted(m for m in ('ray', 'fastapi', 'pyarrow', 'serving.app') if m in sys.modules); "
            "import serving.server, serving.http, serving.service; "
            "served = sorted(m for m in ('ray', 'pyarrow', 'serving.app') if m in sys.modules); "
            "print(json.dumps([first, then, served]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == [[], [], []]


@pytest.mark.parametrize("options, named", [
    ({"beam_size": 0}, "beam_size"), ({"beam_size": 2, "sampling_topk": 3}, "sampling needs beam_size 1"),
    ({"length_penalty": float("nan")}, "length_penalty"), ({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"),
    ({"return_attention": 1}, "return_attention"), ({"num_hypotheses": 3}, "num_hypotheses"),
])
def test_a_bad_option_is_refused_before_its_request_queues(dates: Seq2Seq, options: dict, named: str) -> None:
    """Options were checked only when the batch decoded: a bad one waited in the queue and the batch wait for its
    400. They are checked as the request comes, as the decode would check them."""
    from serving.jobs import token_job
    from serving.schemas import TranslateRequest

    defaults = TranslateRequest(texts=[]).options()
    with pytest.raises(InputError, match=named):
        token_job(dates, ["a"], {**defaults, **options}, MAX_BATCH, 512, 16)
    assert token_job(dates, ["a"], dict(defaults), MAX_BATCH, 512, 16).options == defaults


def test_only_a_sampling_request_decodes_alone(dates: Seq2Seq) -> None:
    """sampling_topp and sampling_temperature at sampling_topk 1 do not sample (the decode is greedy or a beam), so
    such requests merge with their like; they were decoded alone as sampling."""
    from serving.jobs import token_job
    from serving.schemas import TranslateRequest

    defaults = TranslateRequest(texts=[]).options()
    cooled = {**defaults, "sampling_temperature": 0.5, "sampling_topp": 0.9}
    assert token_job(dates, ["a"], cooled, MAX_BATCH, 512, 16).key == token_job(dates, ["b"], cooled, MAX_BATCH,
                                                                                   512, 16).key is not None
    assert token_job(dates, ["a"], {**defaults, "sampling_topk": 0}, MAX_BATCH, 512, 16).key is None


def test_one_bad_request_in_a_batch_fails_alone(dates: Seq2Seq, squares: Seq2Seq) -> None:
    """The batcher without Ray: a request that fails while merged is decoded alone, so only it gets the error."""
    from runtime.errors import InputError
    from serving.batching import decode_points, decode_texts
    from serving.jobs import point_job, token_job
    from serving.schemas import TranslateRequest

    defaults = TranslateRequest(texts=[]).options()
    jobs = [token_job(dates, texts, defaults, MAX_BATCH, 512, 16) for texts in (TEXTS[:2], ["1" * 3000], TEXTS[2:3])]
    done = decode_texts(dates, jobs)
    assert isinstance(done[1].value, InputError) and "texts[0]" in str(done[1].value)
    for job, result in zip([jobs[0], jobs[2]], [done[0], done[2]]):
        assert [[h.ids for h in hyps] for hyps in result.value] == \
            [[h.ids for h in hyps] for hyps in dates.translate_batch(job.texts)]
    sampled = [token_job(dates, TEXTS[:1], {**defaults, "sampling_topk": 3, "seed": 1}, MAX_BATCH, 512, 16)] * 2
    assert [d.batch_requests for d in decode_texts(dates, sampled)] == [1, 1]  # samples never merge
    points = [point_job(squares, s, None, target_len, MAX_BATCH, 512) for s, target_len in
              zip(sources(4), [2, 3, 2, 3])]
    found = decode_points(squares, points)
    assert [d.batch_requests for d in found] == [2, 2, 2, 2]  # merged by target length
    for job, result in zip(points, found):
        want, alphas = squares.predict(job.source, target_len=job.target_len, return_attention=True)
        np.testing.assert_allclose(result.value[0], want, rtol=POINT_TOL, atol=POINT_TOL)
        np.testing.assert_allclose(result.value[1], alphas, rtol=POINT_TOL, atol=POINT_TOL)


def test_a_merged_batch_short_of_memory_is_decoded_a_request_at_a_time(dates: Seq2Seq) -> None:
    """A MemoryError in a merged decode (the batcher's own arrays, such as merged sources padded to the longest;
    the runtime raises its own as ResourceError) ended every request in it without an answer; now each request is
    decoded alone, and one that alone cannot be decoded gets a ResourceError (HTTP 503) saying to ask for less."""
    from runtime.errors import ResourceError
    from serving.batching import SMALLER, decode_texts
    from serving.jobs import token_job
    from serving.schemas import TranslateRequest

    calls: list[int] = []

    class Tight:  # the model, in a process whose memory holds at most 2 texts' decode at a time
        def __getattr__(self, name: str) -> Any:
            return getattr(dates, name)

        def translate_batch(self, texts: list[str], **options: Any) -> Any:
            calls.append(len(texts))
            if len(texts) > 2:
                np.empty(1 << 62, np.uint8)  # numpy's own MemoryError, as the search's arrays raise it
            return dates.translate_batch(texts, **options)

    defaults = TranslateRequest(texts=[]).options()
    jobs = [token_job(dates, texts, defaults, MAX_BATCH, 512, 16) for texts in (TEXTS[:2], TEXTS[:3], TEXTS[2:3])]
    done = decode_texts(Tight(), jobs)
    assert calls == [6, 2, 3, 1]
    assert [d.batch_requests for d in done] == [1, 1, 1] and [d.batch_rows for d in done] == [2, 3, 1]
    assert isinstance(done[1].value, ResourceError)
    assert str(done[1].value) == ("this request (3 inputs) needs more memory to decode than this server has free now"
                                  + SMALLER["tokens"])
    for job, result in zip([jobs[0], jobs[2]], [done[0], done[2]]):
        assert [[h.ids for h in hyps] for hyps in result.value] == \
            [[h.ids for h in hyps] for hyps in dates.translate_batch(job.texts)]


def test_merged_texts_get_the_attention_width_of_their_own_request(dates: Seq2Seq) -> None:
    """A short text decoded beside a long one: its attention is as wide as its own decode's, not the batch's."""
    from serving.batching import decode_texts
    from serving.jobs import token_job
    from serving.schemas import TranslateRequest

    options = {**TranslateRequest(texts=[]).options(), "return_attention": True, "beam_size": 2}
    jobs = [token_job(dates, texts, options, MAX_BATCH, 512, 16)
            for texts in (["1/2/03"], ["saturday, january 1 2000"])]
    done = decode_texts(dates, jobs)
    assert [d.batch_requests for d in done] == [2, 2]  # merged
    for job, result in zip(jobs, done):
        want = dates.translate_batch(job.texts, beam_size=2, return_attention=True)
        for got_hyps, want_hyps in zip(result.value, want):
            for got, alone in zip(got_hyps, want_hyps):
                assert got.ids == alone.ids and got.attention.shape == alone.attention.shape
                np.testing.assert_allclose(got.attention, alone.attention, rtol=SCORE_RTOL, atol=1e-7)


def test_a_route_prefix_holds_every_route_docs_included(dates: Seq2Seq) -> None:
    """serve --route-prefix on the one process: the routes, the docs and the 404's list of routes all under it."""
    from fastapi.testclient import TestClient

    from serving.config import ServeConfig
    from serving.http import ROUTES, attach, create_app
    from serving.service import Service

    service = Service(dates, ServeConfig(), name="prefixed")
    try:
        with TestClient(attach(create_app("/dates"), service)) as client:
            assert client.get("/dates/v1/model").status_code == 200
            with warnings.catch_warnings():  # GET and HEAD of /healthz shared an operation id: FastAPI warned
                warnings.simplefilter("error")
                assert client.get("/dates/openapi.json").is_success and client.get("/dates/docs").status_code == 200
            for method, path in ROUTES:  # HEAD wherever GET is (it was 405 on /v1/model and /metrics)
                if method == "GET":
                    head = client.head("/dates" + path)
                    assert head.status_code == 200 and not head.content, (path, head.status_code)
            assert client.post("/dates/v1/translate", json={"texts": ["3/3/15"]}).status_code == 200
            missing = client.get("/v1/model")
            assert missing.status_code == 404 and "GET/HEAD /dates/v1/model" in missing.json()["error"]
            for oauth in ("/docs/oauth2-redirect", "/dates/docs/oauth2-redirect"):  # FastAPI's, outside the prefix
                assert client.get(oauth).status_code == 404, oauth
            for body in ({"source": [[[1.0, 2.0]]]}, {"texts": ["3/3/15"]}):  # the runtime's refusal; FastAPI's
                wrong = client.post("/dates/v1/predict", json=body)
                assert wrong.status_code == 400 and "to /dates/v1/translate" in wrong.json()["error"], wrong.text
            assert client.get("/docs").status_code == 404
            # every answer of a route counted under the route's own path, whichever layer answered it (the
            # body limit's 413 was under /dates/v1/translate, the rest under /v1/translate)
            assert client.post("/dates/v1/translate", json={"texts": ["a"], "beam": 2}).status_code == 422
            oversized = b'{"texts": ["' + b"1" * ServeConfig().max_body_bytes + b'"]}'
            assert client.post("/dates/v1/translate", content=oversized,
                               headers={"content-type": "application/json"}).status_code == 413
            shown = client.get("/dates/metrics").text
            counted = re.findall(r'seq2onnx_requests_total\{route="([^"]*)",status="(\d+)"\} 1\.0', shown)
            assert {("/v1/translate", "200"), ("/v1/translate", "413"), ("/v1/translate", "422")} <= set(counted)
            assert 'route="/dates' not in shown, shown
    finally:
        service.close()


def test_merged_points_are_of_similar_lengths_and_get_attention_only_when_asked(squares: Seq2Seq) -> None:
    """A 3-point request beside a 600-point one is not padded to 600 (nor its attention, nor anyone else's), and a
    batch where no request asked for attention makes none: one large request used to cost every request merged
    with it gigabytes and seconds."""
    from serving.batching import MAX_PADDING, PADDING_FREE, decode_points, similar_lengths
    from serving.jobs import point_job

    assert similar_lengths([0, 1, 2, 3], [3, 50000, 4, 6]) == [[0, 2, 3], [1]]
    n = PADDING_FREE
    assert similar_lengths([5, 6, 7], [n, n * MAX_PADDING, n * MAX_PADDING + 1]) == [[5, 6], [7]]
    assert similar_lengths([5, 6, 7], [1, 2, n]) == [[5, 6, 7]]  # short ones merge freely
    rng = np.random.default_rng(3)
    lengths, wants = [3, 600, 5, 4], [True, False, False, False]
    jobs = [point_job(squares, rng.normal(size=(2, n, 2)).astype(np.float32).tolist(), None, 4, MAX_BATCH, 512,
                      attention=want) for n, want in zip(lengths, wants)]
    found = decode_points(squares, jobs)
    assert [d.batch_requests for d in found] == [3, 1, 3, 3]
    assert [d.value[1] is None for d in found] == [False, True, True, True]
    for job, result in zip(jobs, found):
        want, alphas = squares.predict(job.source, target_len=4, return_attention=True)
        np.testing.assert_allclose(result.value[0], want, rtol=POINT_TOL, atol=POINT_TOL)
        if job.attention:
            np.testing.assert_allclose(result.value[1], alphas, rtol=POINT_TOL, atol=POINT_TOL)


def test_a_length_over_the_bound_names_the_bound_it_hit(squares: Seq2Seq) -> None:
    """The model's own length is always allowed: where it is the larger bound, the message said that
    --max-decoding-length (1 here) allowed 2."""
    from serving.jobs import check_length

    with pytest.raises(InputError, match=r"target_len: at most 2 on this server \(the model's own length; serve "
                                         r"--max-decoding-length 1 is below it\), got 3"):
        check_length("target_len", 3, squares, 1)
    with pytest.raises(InputError, match=r"at most 5 on this server \(serve --max-decoding-length\), got 6"):
        check_length("target_len", 6, squares, 5)
    check_length("target_len", 2, squares, 1)


def test_model_info_gives_the_length_bound_the_server_enforces(dates: Seq2Seq, transformer_export: Any) -> None:
    """/v1/model said max_decoding_length 5 under --max-decoding-length 5, while the server took the model's own
    length (11) and refused 12 (found by a fresh walk): it now gives the bound requests meet, which never passes
    what the model can produce (a transformer's position table)."""
    from serving.jobs import length_bound

    port = free_port()
    with embedded({"/tokens": (DATES, ServeConfig(**{**COMMON, "max_decoding_length": 5}))}, port):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            bound = client.get("/tokens/v1/model").json()["max_decoding_length"]
            assert bound == dates.spec.target_len == 11
            at = client.post("/tokens/v1/translate", json={"texts": ["3/3/15"], "max_decoding_length": bound})
            past = client.post("/tokens/v1/translate", json={"texts": ["3/3/15"], "max_decoding_length": bound + 1})
    assert at.status_code == 200 and past.status_code == 400 and f"at most {bound} on this server" in past.text
    model = Seq2Seq.load(transformer_export.path, threads=1)
    assert length_bound(model, 512) == model.spec.max_positions < 512
