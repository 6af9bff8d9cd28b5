"""Why each hypothesis ended (Translation.finish_reason): "eos" where the model ended it, "length" where the decode
reached max_decoding_length first. The same in the runtime, `seq2onnx infer`'s JSON lines and over HTTP."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from runtime.model import Seq2Seq
from serving.config import ServeConfig

from support.serve import embedded, free_port

DATES = Path(__file__).resolve().parents[1] / "artifacts" / "dates"
TEXTS = ["tuesday, march 3 2015", "3/3/15", "12 august 1999"]
SEARCHES = {"greedy": {}, "beam": dict(beam_size=4, num_hypotheses=2), "sampling": dict(sampling_topk=0, seed=5)}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("search", list(SEARCHES))
def test_an_output_cut_at_the_bound_says_length_and_one_the_model_ended_says_eos(fused, search):
    """The shipped dates model writes 10 tokens, then eos. At max_decoding_length 10 it never reaches its eos: the
    same 10 tokens, cut ("length"); at 11 its eos takes the eleventh step ("eos")."""
    model = Seq2Seq.load(DATES, fused=fused, threads=1)
    options = SEARCHES[search]
    free = model.translate_batch(TEXTS, max_decoding_length=50, **options)
    assert {h.finish_reason for hyps in free for h in hyps} == {"eos"}
    n = len(free[0][0].tokens)
    assert n == 10 and all(len(hyps[0].tokens) == n for hyps in free)
    cut = model.translate_batch(TEXTS, max_decoding_length=n, **options)
    assert [hyps[0].tokens for hyps in cut] == [hyps[0].tokens for hyps in free]
    assert {h.finish_reason for hyps in cut for h in hyps} == {"length"}
    ended = model.translate_batch(TEXTS, max_decoding_length=n + 1, **options)
    assert [hyps[0].tokens for hyps in ended] == [hyps[0].tokens for hyps in free]
    assert [hyps[0].finish_reason for hyps in ended] == ["eos"] * len(TEXTS)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("export", ["recurrent_export", "transformer_export"])
@pytest.mark.parametrize("search", list(SEARCHES))
def test_length_is_said_exactly_where_an_output_fills_the_bound(request, export, fused, search):
    """Untrained models run outputs to the bound (and some end earlier): each says which, with or without its fast
    graphs, and however the beam fills its n-best."""
    path = request.getfixturevalue(export).path
    model = Seq2Seq.load(path, fused=fused, threads=1)
    texts = ["one", "two three", "four five six", "seven", "eight nine", "ten"] * 2
    seen = set()
    for bound in (1, 3, 8):
        found = model.translate_batch(texts, max_decoding_length=bound, **SEARCHES[search])
        for hyps in found:
            for h in hyps:
                assert len(h.tokens) <= bound
                assert h.finish_reason == ("length" if len(h.tokens) == bound else "eos"), (bound, h)
                seen.add(h.finish_reason)
    assert "length" in seen  # (the dates tests above see both: these untrained models may never end an output)


def test_infer_and_the_server_say_why_each_hypothesis_ended():
    proc = subprocess.run([sys.executable, "-m", "cli", "infer", str(DATES), "--text", TEXTS[0], "--max-len", "4",
                           "--text", TEXTS[1], "--beam", "2", "--n-best", "2", "--threads", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [[h["finish_reason"] for h in line["hypotheses"]] for line in lines] == [["length"] * 2] * 2
    port = free_port()
    with embedded({"/dates": (DATES, ServeConfig(batch_wait_ms=1.0))}, port):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            cut = client.post("/dates/v1/translate", json={"texts": TEXTS, "max_decoding_length": 4})
            ended = client.post("/dates/v1/translate", json={"texts": TEXTS})
            schema = client.get("/dates/openapi.json").json()
    assert cut.status_code == 200 and ended.status_code == 200, (cut.text, ended.text)
    assert [hyps[0]["finish_reason"] for hyps in cut.json()["translations"]] == ["length"] * len(TEXTS)
    assert [hyps[0]["finish_reason"] for hyps in ended.json()["translations"]] == ["eos"] * len(TEXTS)
    described = schema["components"]["schemas"]["Hypothesis"]["properties"]["finish_reason"]
    assert described["enum"] == ["eos", "length"] and "max_decoding_length" in described["description"]
    asked = schema["components"]["schemas"]["TranslateRequest"]["properties"]  # the bounds a client can read
    assert (asked["max_decoding_length"]["minimum"], asked["min_decoding_length"]["minimum"]) == (1, 0)
