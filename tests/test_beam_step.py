"""A recurrent model's beam step (beam_step.onnx): the decoder step over beam search's rows with what attention
reads held once per input, so an input's k queries attend to its one copy together. The same ids as the plain step
driven by the same search, scores within float32 rounding; exports without it load and decode as before."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch

from runtime.contract import BEAM_STEP_FILE, MANIFEST_FILE, ROWS
from runtime.errors import Cancelled
from runtime.model import Seq2Seq
from runtime.optional_graphs import has_beam_step, token_beam_step_io
from runtime.search import beam_search
from runtime.spec import ModelSpec
from runtime.tokens import encode_sources
from runtime.vocab import BOS, EOS
from training.tokens.builtin import toy_translation
from training.tokens.recurrent import TokenSeq2Seq

from support.models import export_token_model, toy_token_spec

SCORE_RTOL = 1e-5  # the folded attention sums in another order: float32 rounding
SPECS = {"gru-dot-bi": dict(cell="gru", attention="dot", bidirectional=True),
         "lstm-additive-2layers": dict(cell="lstm", attention="additive", layers=2),
         "gru-multihead": dict(cell="gru", attention="multihead", n_heads=2)}
TEXTS = list(toy_translation()[0].sources)


@pytest.fixture(scope="module", params=list(SPECS))
def beam_export(request, tmp_path_factory):
    spec = toy_token_spec(hidden_dim=8, embedding_dim=6, **SPECS[request.param])
    return export_token_model(spec, tmp_path_factory.mktemp("beam_step") / "model")


@pytest.mark.parametrize("fields", [dict(cell=c, attention=a, bidirectional=b, layers=n, n_heads=2 if a == "multihead"
                                         else 1) for c in ("gru", "lstm") for a in ("dot", "additive", "multihead")
                                    for b, n in ((False, 1), (True, 2))])
def test_the_folded_step_computes_the_step_of_every_row(fields):
    spec = ModelSpec(kind="tokens", hidden_dim=8, embedding_dim=6, source_vocab_size=11, target_vocab_size=9,
                     **fields)
    torch.manual_seed(0)
    model = TokenSeq2Seq(spec).eval()
    ids = torch.tensor([[4, 5, 6, 7], [8, 9, 0, 0], [5, 10, 4, 0]])
    k = 3
    with torch.no_grad():
        state = {name: value for name, value in model.encode(ids, torch.tensor([4, 2, 3])).items()
                 if value is not None}
        rows = {name: v.repeat_interleave(k, dim=1) for name, v in state.items() if name in ("hidden", "cell")}
        hidden = {name: v + torch.randn_like(v) for name, v in rows.items()}  # beams differ
        expanded = {name: v.repeat_interleave(k, dim=0) for name, v in state.items() if name not in rows}
        previous = torch.randint(4, 9, (3 * k,))
        want = model.step(previous, {**expanded, **hidden})
        got = model.folded_step(previous, {**state, **hidden})
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)  # log-probs
    torch.testing.assert_close(got[2], want[2], atol=1e-6, rtol=1e-5)  # attention
    for name in rows:
        torch.testing.assert_close(got[1][name], want[1][name])


def test_the_export_writes_a_beam_step_with_rows_and_inputs_apart(beam_export):
    manifest = json.loads((beam_export.path / MANIFEST_FILE).read_text())
    assert BEAM_STEP_FILE in manifest["graphs"]
    summary = json.dumps(manifest["parity"]["summary"])
    assert "beam_step.ids" in summary and "beam_step.scores" in summary and manifest["parity"]["passed"]
    declared = token_beam_step_io(Seq2Seq.load(beam_export.path).spec)
    graph = onnx.load(str(beam_export.path / BEAM_STEP_FILE)).graph
    for value in [*graph.input, *graph.output]:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        assert dims == {**declared["inputs"], **declared["outputs"]}[value.name], value.name
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == [ROWS]


def _plain(path, tmp_path):
    """A copy of the export as exports before the beam step were: its file and manifest entry gone."""
    old = tmp_path / "old"
    shutil.copytree(path, old)
    (old / BEAM_STEP_FILE).unlink()
    manifest = json.loads((old / MANIFEST_FILE).read_text())
    del manifest["graphs"][BEAM_STEP_FILE]
    (old / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return old


def test_beam_search_finds_what_the_plain_step_finds(beam_export, tmp_path):
    """Random batches and options, inputs finishing at different steps: the same n-best through translate_batch
    (which runs the beam step), and through an export without it."""
    runtime, old = Seq2Seq.load(beam_export.path), Seq2Seq.load(_plain(beam_export.path, tmp_path))
    assert runtime.token_steps.has_beam_step and not old.token_steps.has_beam_step
    rng = np.random.default_rng(0)
    for _ in range(10):
        k = int(rng.integers(1, 6))
        texts = list(rng.choice(TEXTS, int(rng.integers(1, 7))))
        options = dict(beam_size=k, num_hypotheses=int(rng.integers(1, k + 1)), max_decoding_length=int(
            rng.integers(1, 12)), length_penalty=float(rng.choice([0.0, 1.0, 2.0])), return_attention=True)
        got, want = runtime.translate_batch(texts, **options), old.translate_batch(texts, **options)
        assert [[t.ids for t in n] for n in got] == [[t.ids for t in n] for n in want], options
        np.testing.assert_allclose([t.score for n in got for t in n], [t.score for n in want for t in n],
                                   rtol=SCORE_RTOL)
        for a, b in zip((t for n in got for t in n), (t for n in want for t in n)):
            np.testing.assert_allclose(a.attention, b.attention, atol=1e-6)


def test_the_beam_step_is_what_beam_search_drives(beam_export):
    """beam_search(per_input=True) over the beam step, and over the plain step with everything per row."""
    steps = Seq2Seq.load(beam_export.path).token_steps
    source = Seq2Seq.load(beam_export.path).vocabularies["source"]
    state = steps.encode(*encode_sources(TEXTS, source, steps.spec))
    common = dict(batch_size=len(TEXTS), bos_id=BOS, eos_id=EOS, beam_size=3, num_hypotheses=2,
                  max_decoding_length=9, constant=steps.constant)
    folded = beam_search(steps.beam_step, state, steps.batch_axes, per_input=True, **common)
    plain = beam_search(steps.step, state, steps.batch_axes, **common)
    assert [[h.tokens for h in n] for n in folded] == [[h.tokens for h in n] for n in plain]


def test_a_beam_search_through_the_beam_step_can_be_cancelled(beam_export):
    runtime = Seq2Seq.load(beam_export.path)
    asked = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) > 3

    with pytest.raises(Cancelled):
        runtime.translate_batch(TEXTS, beam_size=4, max_decoding_length=12, cancel=cancel)
    assert len(asked) == 4  # asked before every step: the fourth stopped it


def test_models_without_per_input_attention_have_no_beam_step(transformer_export, tmp_path):
    none = export_token_model(toy_token_spec(hidden_dim=8, embedding_dim=6, attention="none"), tmp_path / "model")
    for path in (none.path, transformer_export.path):
        runtime = Seq2Seq.load(path)
        assert not has_beam_step(runtime.spec) and not (path / BEAM_STEP_FILE).exists()
        assert not runtime.token_steps.has_beam_step


def test_an_int8_export_quantizes_its_beam_step_and_beams_run_through_it(tmp_path):
    spec = toy_token_spec(hidden_dim=8, embedding_dim=6, cell="gru", attention="dot")
    export = export_token_model(spec, tmp_path / "model", quantize="int8", accept_quality_loss=True)
    manifest = json.loads((export.path / MANIFEST_FILE).read_text())
    assert manifest["precision"]["quantized_ops"][BEAM_STEP_FILE]  # not left float32 beside int8 graphs
    runtime = Seq2Seq.load(export.path)
    assert runtime.token_steps.has_beam_step
    assert all(n for n in runtime.translate_batch(TEXTS, beam_size=3, num_hypotheses=2))
