"""`seq2onnx infer --ray` (Ray Data) on real Ray: the same records as in-process `infer`, in input order, written
whole or not at all. One local Ray per module for the Python API; two CLI runs in subprocesses (one starts its own
Ray, one joins the module's with --address); refusals that must come before Ray starts run without it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import ray

from cli.infer_ray import STOPPING_LINE
from runtime.infer_tokens import Item, TokenRun
from runtime.model import Seq2Seq
from serving.offline import (
    MAX_POINT_BLOCK,
    Plan,
    PointDecoder,
    TokenDecoder,
    block_rows,
    decode,
    decode_rows,
    decode_texts,
    point_dataset,
    token_dataset,
)
from training.tokens.builtin import generate_dates

from support.processes import default_stops, group_members, leftovers, wait_until
from support.serve import DATES, SQUARES, local_ray

CHECKPOINTS = {"tokens": DATES.parent / "dates-checkpoint", "points": SQUARES.parent / "squares-checkpoint"}

pytestmark = pytest.mark.ray

SCORE_RTOL, SCORE_ATOL = 1e-5, 1e-6  # float32 graphs; sorted sub-batches pad differently than in-process chunks
ATTENTION_ATOL = 2e-6  # attention is written rounded to 6 decimals: a drift in the 7th may flip the last digit
POINT_RTOL = 1e-5
USAGE, BAD_INPUT = 2, 1
GREEDY = dict(beam_size=1, num_hypotheses=1, length_penalty=1.0, max_decoding_length=None, min_decoding_length=0,
              sampling_topk=1, sampling_topp=1.0, sampling_temperature=1.0, seed=None)


def date_lines(n: int, seed: int) -> list[str]:
    """n date strings of every format (3 to 30 characters), with blank and whitespace-only lines among them."""
    lines = []
    for i, text in enumerate(generate_dates(n, seed).sources):
        lines.append(text)
        lines.extend([""] * (i % 41 == 7) + ["  "] * (i % 53 == 11))
    return lines


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A new local Ray for the module (2 CPUs, no dashboard, no usage stats); yields its address. ray.init turns on
    token authentication by setting RAY_AUTH_MODE in os.environ (children joining need it); it is undone after."""
    with local_ray():
        yield ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred dates, one per line, with blank lines."""
    path = tmp_path_factory.mktemp("ray_data") / "dates.txt"
    path.write_text("\n".join(date_lines(300, 11)) + "\n", encoding="utf-8")
    return path


def child_env() -> dict[str, str]:
    """This process's environment (with the module Ray's RAY_AUTH_MODE while it runs), without usage stats."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}


def cli(*args: object) -> subprocess.CompletedProcess:
    """`seq2onnx ARGS` in a child process."""
    return subprocess.run([sys.executable, "-m", "cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=child_env())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON lines file."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def in_process(texts: list[str], options: dict[str, Any], batch_size: int, attention: bool,
               model: Path = DATES) -> list[dict]:
    """What in-process `infer` writes for these texts: TokenRun's records, as JSON round-trips them."""
    run = TokenRun(Seq2Seq.load(model), options, batch_size, attention, False)
    items = (Item(i, text, f"texts[{i}]") for i, text in enumerate(texts))
    return [json.loads(json.dumps(doc)) for doc in run.records(items)]


def assert_same_records(found: list[dict], expected: list[dict]) -> None:
    """Same records, fields and order; token ids and texts exact, scores (and attention) within tolerance."""
    assert [r["index"] for r in found] == [r["index"] for r in expected]
    for got, want in zip(found, expected):
        assert got.keys() == want.keys() and got["source"] == want["source"]
        assert len(got["hypotheses"]) == len(want["hypotheses"])
        for g, w in zip(got["hypotheses"], want["hypotheses"]):
            assert g.keys() == w.keys()
            assert (g["tokens"], g["text"]) == (w["tokens"], w["text"])
            np.testing.assert_allclose([g["score"], g["log_prob"]], [w["score"], w["log_prob"]], rtol=SCORE_RTOL,
                                       atol=SCORE_ATOL)
            if "attention" in w:
                np.testing.assert_allclose(g["attention"], w["attention"], rtol=0, atol=ATTENTION_ATOL)


# ---- the command line ---------------------------------------------------------------------------------------------

def test_cli_on_ray_writes_what_in_process_infer_writes(texts_file: Path, tmp_path: Path) -> None:
    expected, found = tmp_path / "in_process.jsonl", tmp_path / "ray.jsonl"
    found.write_text("an older result\n")
    texts = tmp_path / "texts.txt"  # with a text beyond ASCII: written as it is, in UTF-8, by both
    texts.write_text(texts_file.read_text(encoding="utf-8") + "3 ao\u00fbt 2015\n", encoding="utf-8")
    reference = cli("infer", DATES, "--input", texts, "--output", expected)
    assert reference.returncode == 0, reference.stderr
    result = cli("infer", DATES, "--input", texts, "--output", found, "--ray", "--concurrency", "2", "--force")
    assert result.returncode == 0, result.stderr
    assert_same_records(read_jsonl(found), read_jsonl(expected))
    assert all('"source": "3 ao\u00fbt 2015"'.encode() in path.read_bytes() for path in (found, expected))
    assert "on 2 actors" in result.stderr and "Traceback" not in result.stderr
    note = [line for line in reference.stderr.splitlines() if line.startswith("note: skipped")]
    assert note and note[0] in result.stderr.splitlines()
    assert not list(tmp_path.glob(".*.tmp"))


def test_cli_joins_a_cluster_and_samples_exactly_as_in_process(cluster: str, texts_file: Path,
                                                                tmp_path: Path) -> None:
    sampling = ("--sample", "--top-k", "5", "--temperature", "1.5", "--seed", "7", "--batch-size", "16")
    expected, found = tmp_path / "in_process.jsonl", tmp_path / "ray.jsonl"
    assert cli("infer", DATES, "--input", texts_file, "--output", expected, *sampling).returncode == 0
    result = cli("infer", DATES, "--input", texts_file, "--output", found, *sampling, "--ray", "--address", cluster)
    assert result.returncode == 0, result.stderr
    assert found.read_bytes() == expected.read_bytes()  # the same draws: same chunks, same seeds


def test_cli_on_ray_decodes_a_declared_model(cluster: str, tmp_path: Path) -> None:
    """A model exported through a declared contract (export.adapter) reads its sources by its manifest's contract:
    --ray passes it on, as in-process infer does."""
    from export.api import export_model

    from support.foreign import corpus, trained

    model = export_model(trained("luong").adapter(), tmp_path / "luong")
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"{source}\n" for source, _ in corpus(20, seed=4)))
    expected, found = tmp_path / "in_process.jsonl", tmp_path / "ray.jsonl"
    assert cli("infer", model, "--input", texts, "--output", expected, "--beam", "3").returncode == 0
    result = cli("infer", model, "--input", texts, "--output", found, "--beam", "3", "--ray", "--address", cluster)
    assert result.returncode == 0, result.stderr
    assert_same_records(read_jsonl(found), read_jsonl(expected))


@pytest.fixture(scope="module")
def int8_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The shipped checkpoints exported in int8 (activations quantized per call, over the call's rows)."""
    from export.api import export_model

    root = tmp_path_factory.mktemp("int8")
    return {kind: export_model(CHECKPOINTS[kind], root / kind, quantize="int8") for kind in CHECKPOINTS}


def test_an_int8_token_export_is_decoded_in_infers_own_calls(cluster: str, texts_file: Path,
                                                             int8_exports: dict[str, Path]) -> None:
    """Sorted sub-batches gave an int8 export's texts other neighbours than in-process infer's chunks: 2 of 300
    dates decoded to other ids and scores moved by up to 2.5e-3 (found by a fresh walk). Its actors now decode
    infer's chunks as they are: the same records, to the last digit."""
    texts = texts_file.read_text(encoding="utf-8").splitlines()
    options = {**GREEDY, "beam_size": 3, "num_hypotheses": 2}
    plan = Plan(str(int8_exports["tokens"]), batch_size=8, options=options)
    found = [json.loads(line) for line in decode_texts(texts, plan, actors=2)]
    assert found == in_process(texts, options, 8, False, int8_exports["tokens"])


def test_an_int8_point_export_on_ray_is_decoded_in_one_call_as_without_ray(cluster: str, tmp_path: Path,
                                                                        int8_exports: dict[str, Path]) -> None:
    """Blocks spread over two actors moved an int8 point model's outputs by ~4e-4 from infer's one call (found by
    a fresh walk): its rows now go as one block to one actor, which is said, and the values are the same."""
    points = tmp_path / "points.npy"
    np.save(points, np.random.default_rng(8).uniform(-1, 1, size=(90, 3, 2)).astype(np.float32))  # (N, L, F)
    expected, found = tmp_path / "in_process.json", tmp_path / "ray.jsonl"
    model = int8_exports["points"]
    assert cli("infer", model, "--input", points, "--attention", "--output", expected).returncode == 0
    result = cli("infer", model, "--input", points, "--attention", "--output", found, "--ray", "--address", cluster,
                 "--concurrency", "2")
    assert result.returncode == 0, result.stderr
    assert "on 1 actor" in result.stderr and "is an int8 export" in result.stderr, result.stderr
    rows, whole = read_jsonl(found), json.loads(expected.read_text())
    assert [r["outputs"] for r in rows] == whole["outputs"] and [r["attention"] for r in rows] == whole["attention"]


def test_existing_output_is_kept_without_force_and_on_a_bad_line(texts_file: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text("keep me\n")
    refused = cli("infer", DATES, "--input", texts_file, "--output", output, "--ray")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(texts_file.read_bytes() + b"caf\xe9 3/3/15\n")
    failed = cli("infer", DATES, "--input", bad, "--output", output, "--ray", "--force")
    for result, says in ((refused, ("out.jsonl", "--force")), (failed, (f"line {len(date_lines(300, 11)) + 1}",
                                                                        "UTF-8"))):
        assert result.returncode == BAD_INPUT, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and all(s in errors[0] for s in says), result.stderr
        assert "Traceback" not in result.stderr
    assert output.read_text() == "keep me\n" and sorted(tmp_path.iterdir()) == sorted([bad, output])


@pytest.mark.parametrize("output, ray_flag", [("out.npz", []), ("out.jsonl", ["--ray"])])
def test_a_point_input_refused_for_its_values_names_the_file_with_or_without_ray(tmp_path: Path, output: str,
                                                                                  ray_flag: list[str]) -> None:
    source = tmp_path / "points.npy"
    np.save(source, np.array([[[0.5, 0.5], [0.1, 0.2]], [[np.nan, 0.0], [0.3, 0.4]]], np.float32))  # (N, L, F)
    result = cli("infer", SQUARES, "--input", source, "--output", tmp_path / output, *ray_flag)
    assert result.returncode == BAD_INPUT, result.stderr
    assert f"Error: --input: {source}: source: expected finite values" in result.stderr
    assert "batch item 1" in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == [source]


# When the signal comes: Ray's first processes exist (ray.init under way; raised inside it, Ctrl-C left Ray's agents
# running); the output's temporary sibling exists (decoding; SIGTERM's default action left that file behind); the
# output is published and Ray is stopping (a signal there said that nothing was written).
STARTING, DECODING, STOPPING = "ray-starts", "decoding", "ray-stops"


def _signal_infer_on_ray(tmp_path: Path, when: str, signals: list[int], texts_n: int = 20000) -> tuple[int, str]:
    """Run `infer --ray` on `texts_n` texts over an older --output; send `signals` (each once the one before was
    taken) once `when`: Ray started its processes, the output is being written, or it is published and Ray is
    stopping (under a second here since cli.ray_shutdown, ~6 s before: the signal comes 20 ms after). Return
    the exit code and what it said, after checking that nothing is beside the output, which is as it was (or whole,
    once published), and that nothing of its process group is left 20 s on."""
    texts, out = tmp_path / "texts.txt", tmp_path / "out.jsonl"
    texts.write_text("\n".join(date_lines(texts_n, 5)) + "\n", encoding="utf-8")
    out.write_text("an older result\n")
    reached = {STARTING: lambda: len(group_members(proc.pid)) >= 2,
               # Ray is up too: the output's check makes and removes that sibling before Ray starts
               DECODING: lambda: (any(p.name.startswith(".out.jsonl.") for p in tmp_path.iterdir())
                                  and len(group_members(proc.pid)) >= 2),
               STOPPING: lambda: out.read_text() != "an older result\n"}[when]
    with open(tmp_path / "log", "w") as log, open(tmp_path / "stdout", "w") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "infer", str(DATES), "--input", str(texts), "--output",
                                 str(out), "--ray", "--force"], stdout=stdout, stderr=log,
                                env=child_env(), start_new_session=True, preexec_fn=default_stops)
    try:
        wait_until(proc, reached, 120, tmp_path / "log")
        for i, sig in enumerate(signals):
            if i:  # once the first was taken: two sent before the main thread ran its handler counted as one
                wait_until(proc, lambda: STOPPING_LINE in (tmp_path / "log").read_text(), 30, tmp_path / "log")
            proc.send_signal(sig)
    finally:
        left = leftovers(proc, 60, tmp_path / "log")
    said = (tmp_path / "log").read_text()
    assert "Traceback" not in said and not left, (left, said[-3000:])
    # Ray printed its cluster's errors on stdout ('(raylet) Task ... failed ... killed by `ray.kill`', in about
    # half of the stops while decoding), which --ray leaves empty
    assert (tmp_path / "stdout").read_text() == ""
    assert sorted(tmp_path.iterdir()) == [tmp_path / "log", out, tmp_path / "stdout", texts]
    found = out.read_text().splitlines()
    assert (len(found) == texts_n if when == STOPPING else found == ["an older result"]), said[-3000:]
    return proc.returncode, said


@pytest.mark.parametrize("when", [STARTING, DECODING])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_infer_on_ray_and_leaves_nothing(tmp_path: Path, when: str, sig: int) -> None:
    code, said = _signal_infer_on_ray(tmp_path, when, [sig])
    want, says = (130, "interrupted") if sig == signal.SIGINT else (143, "stopped by SIGTERM")
    assert code == want and f"infer: {says}; nothing was written" in said, said[-3000:]
    assert STOPPING_LINE in said


def test_a_second_signal_while_decoding_kills_ray_and_removes_the_staged_output(tmp_path: Path) -> None:
    """The second signal ends the process at once (os._exit, where no `finally` runs): the output being written
    was left behind as a hidden sibling."""
    code, said = _signal_infer_on_ray(tmp_path, DECODING, [signal.SIGTERM, signal.SIGTERM])
    assert code == 143 and "Error: infer --ray: a second signal while stopping: killed the" in said, said[-3000:]
    assert said.rstrip().endswith("this command had started; nothing was written (outputs are published whole or "
                                  "not at all)"), said[-3000:]


# A thread of the driver that calls Ray's core worker two seconds after the work is done, as Ray Data's threads may
# (its reader, finishing the block it was reading when the reader closed; nothing joins it)
LATE_CALL = """
import threading, time
import ray
from cli.infer_ray import ray_session
from cli.ray_stop import Stop


def late():
    core_worker = ray._private.worker.global_worker.core_worker
    time.sleep(2.0)
    core_worker.get_worker_id()


def run():
    with ray_session(None, None, Stop()):
        threading.Thread(target=late, name="iter_threaded", daemon=True).start()


worker = threading.Thread(target=run)
worker.start()
worker.join()
print("Ray stopped, and this process lives on")
"""


def test_ray_stops_once_the_threads_that_call_into_it_are_done(tmp_path: Path) -> None:
    """A thread that called into Ray after ray.shutdown made Ray's core worker end the process ('The core worker has
    already been shutdown ... The process will exit', status 1) while Ray's processes were being stopped, and some
    were left running: once in ~60 stops of infer --ray under load here, by a thread of Ray Data's."""
    with open(tmp_path / "log", "w") as log, open(tmp_path / "stdout", "w") as stdout:
        proc = subprocess.Popen([sys.executable, "-c", LATE_CALL], stdout=stdout, stderr=log, env=child_env(),
                                cwd=Path(__file__).resolve().parents[1], start_new_session=True)
    left = leftovers(proc, 120, tmp_path / "log")
    assert proc.returncode == 0 and not left, (proc.returncode, left, (tmp_path / "log").read_text()[-3000:])
    assert (tmp_path / "stdout").read_text().strip() == "Ray stopped, and this process lives on"


def test_a_second_signal_once_the_output_is_published_says_it_was_written(tmp_path: Path) -> None:
    """The kill said only what it killed, and a user who had passed --force could not tell the old file from the
    new one."""
    code, said = _signal_infer_on_ray(tmp_path, STOPPING, [signal.SIGTERM, signal.SIGTERM], texts_n=2000)
    assert code == 143 and said.rstrip().endswith(f"this command had started; it had written {tmp_path / 'out.jsonl'}"
                                                  ", and nothing else"), said[-3000:]


def test_a_signal_while_ray_stops_after_the_output_is_published_says_it_was_written(tmp_path: Path) -> None:
    """The output was published on the Ray thread; a Ctrl-C while Ray then stopped said 'nothing was written'."""
    code, said = _signal_infer_on_ray(tmp_path, STOPPING, [signal.SIGINT], texts_n=2000)
    assert code == 130, said[-3000:]
    assert said.rstrip().endswith("Error: infer: interrupted; it had written " + str(tmp_path / "out.jsonl")
                                  + ", and nothing else"), said[-3000:]
    assert "infer: 2000 inputs decoded in" in said and f"wrote {tmp_path / 'out.jsonl'} (2000 inputs)" in said


def test_without_ray_installed_the_serve_extra_is_named(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['ray'] = None; from cli.main import main; sys.argv[0] = 'seq2onnx'; "
            "main()")
    args = ["infer", str(DATES), "--text", "3/3/15", "--output", str(tmp_path / "o.jsonl"), "--ray"]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                            env=child_env())
    assert result.returncode == BAD_INPUT, result.stderr
    assert "'serve' extra" in result.stderr and ".[cpu,serve]" in result.stderr and "Traceback" not in result.stderr


# ---- the Python API, on the module's Ray ------------------------------------------------------------------------

def test_beam_with_attention_matches_in_process(cluster: str, texts_file: Path) -> None:
    texts = texts_file.read_text(encoding="utf-8").splitlines()
    options = {**GREEDY, "beam_size": 3, "num_hypotheses": 2}
    plan = Plan(str(DATES), batch_size=8, options=options, attention=True)
    found = [json.loads(line) for line in decode_texts(texts, plan, actors=2)]
    assert_same_records(found, in_process(texts, options, 8, True))


def test_point_rows_match_predict(cluster: str) -> None:
    rng = np.random.default_rng(3)
    source = rng.uniform(-1, 1, size=(37, 5, 2)).astype(np.float32)  # (N, L, F)
    mask = np.ones((37, 1, 5), dtype=bool)  # (N, 1, L)
    mask[::4, :, 3:] = False
    outputs, attention = Seq2Seq.load(SQUARES).predict(source, source_mask=mask, return_attention=True)
    plan = Plan(str(SQUARES), attention=True)
    actors, lines = decode_rows(len(source), partial(point_dataset, source, mask), PointDecoder, plan, 2, 1,
                                MAX_POINT_BLOCK)
    rows = [json.loads(line) for line in lines]
    assert actors == 2 and [r["index"] for r in rows] == list(range(37))
    np.testing.assert_allclose([r["outputs"] for r in rows], outputs, rtol=POINT_RTOL, atol=1e-6)
    np.testing.assert_allclose([r["attention"] for r in rows], attention, rtol=POINT_RTOL, atol=1e-6)


def test_a_failure_on_the_cluster_leaves_the_output_as_it_was(cluster: str, tmp_path: Path) -> None:
    import click

    from cli.infer_ray import write_lines

    output = tmp_path / "out.jsonl"
    output.write_text("keep me\n")
    chunks = [[Item(0, "3/3/15", "texts[0]")]]
    lines = decode(token_dataset(chunks, 8), TokenDecoder, Plan(str(tmp_path / "no_model"), options=GREEDY), 1, 8)
    with pytest.raises(click.ClickException, match="no_model.*does not exist"):
        write_lines(str(output), lines, True)  # as with --force: a failure still leaves it as it was
    assert output.read_text() == "keep me\n" and list(tmp_path.iterdir()) == [output]


# ---- the pieces, without Ray -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, actors, unit", [(300, 2, 32), (10_000, 1, 32), (10_000, 8, 7), (5, 4, 64), (1, 1, 1)])
def test_blocks_hold_whole_chunks(n: int, actors: int, unit: int) -> None:
    rows = block_rows(n, actors, unit, 2048)
    assert rows % unit == 0 and unit <= rows <= max(2048, unit) + unit - 1


def test_an_actor_decodes_sorted_sub_batches_but_keeps_sampling_chunks() -> None:
    texts = ["monday, march 3 2015", "3/3/15", "march 3, 2015", "3.3.15", "2015-03-03"]
    decoder = TokenDecoder(Plan(str(DATES), batch_size=2, options=GREEDY))
    groups = list(decoder.groups(texts, np.zeros(5, dtype=np.int64)))
    assert [rows for rows, _ in groups] == [[1, 3], [4, 2], [0]]  # shortest first, every row once
    decoder = TokenDecoder(Plan(str(DATES), batch_size=2, options={**GREEDY, "sampling_topk": 0, "seed": 1}))
    chunks = np.array([4, 4, 5, 5, 6])
    assert list(decoder.groups(texts, chunks)) == [([0, 1], 4), ([2, 3], 5), ([4], 6)]


@pytest.mark.parametrize("attention", [False, True])
def test_a_point_decoder_makes_attention_only_when_asked(attention: bool) -> None:
    """Without --attention the block is decoded without it: its outputs as with it, and no attention made."""
    rng = np.random.default_rng(5)
    source = rng.uniform(-1, 1, size=(6, 4, 2)).astype(np.float32)  # (N, L, F)
    mask = np.ones((6, 1, 4), dtype=bool)  # (N, 1, L)
    want = Seq2Seq.load(SQUARES).predict(source, source_mask=mask)
    found = PointDecoder(Plan(str(SQUARES), attention=attention))({"source": source, "mask": mask,
                                                                     "index": np.arange(6)})
    rows = [json.loads(line) for line in found["line"]]
    np.testing.assert_allclose([r["outputs"] for r in rows], want, rtol=POINT_RTOL, atol=1e-6)
    assert all(("attention" in r) == attention for r in rows)
