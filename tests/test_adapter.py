"""Bring your own model: three foreign models (tests/support/foreign.py) exported through a declared contract and
decoded by the unchanged runtime exactly as their own PyTorch decodes them; the CLI's --adapter; and a bad
declaration as one line naming what is wrong."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export.adapted import Adapted, probe
from export.adapted_modules import AdaptedEncoder, AdaptedStep
from export.api import export_model
from export.tokens.sides import AdaptedModel
from runtime.contract import GREEDY_FILE, MANIFEST_FILE
from runtime.errors import InputError
from runtime.model import Seq2Seq
from runtime.search import beam_search, greedy_search
from runtime.tokens import encode_sources

from support.foreign import FOREIGN, WORDS, corpus, trained

SCORE_RTOL = 1e-4
TEXTS = [p[0] for p in corpus(24, seed=7)]


@pytest.fixture(scope="module", params=list(FOREIGN))
def foreign(request, tmp_path_factory):
    model = trained(request.param)
    adapter = model.adapter()
    return model, adapter, export_model(adapter, tmp_path_factory.mktemp(request.param) / "model")


def test_the_export_passed_parity_against_the_models_own_decode(foreign):
    _, adapter, path = foreign
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    assert manifest["spec"]["arch"] == "declared" and manifest["parity"]["passed"]
    assert manifest["source"] == f"adapter {adapter.name}"
    summary = manifest["parity"]["summary"]
    for row in ("step.log_probs", "greedy.ids", "beam.ids", "greedy_loop.ids", "reference.ids"):
        assert row in summary, row
    assert summary["reference.ids"]["max_abs"] == 0  # no sequence differs from the model's own greedy decode
    assert GREEDY_FILE in manifest["graphs"]
    assert manifest["contract"]["specials"]["eos"] == adapter.target_vocab.ids.eos


@pytest.mark.parametrize("n", [1, 3, 8])
def test_greedy_and_beam_equal_the_pytorch_decode_over_batches_and_padded_lengths(foreign, n):
    model, adapter, path = foreign
    runtime = Seq2Seq.load(path)
    texts = TEXTS[:n]
    ids, lengths = encode_sources(texts, runtime.vocabularies["source"], runtime.spec, runtime.contract)
    max_len = adapter.max_decoding_length
    own = model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), max_len)
    assert [t[0].ids for t in runtime.translate_batch(texts, max_decoding_length=max_len)] == own
    one_by_one = [runtime.translate_batch([t], max_decoding_length=max_len)[0][0].ids for t in texts]
    assert one_by_one == own  # alone or padded beside longer texts: the same
    torch_side = AdaptedModel(probe(adapter))
    state, step = torch_side.steps(ids, lengths)
    contract = runtime.contract
    common = dict(batch_size=n, bos_id=contract.specials.bos, eos_id=contract.specials.eos,
                  max_decoding_length=max_len, beam_size=4, num_hypotheses=2)
    want = beam_search(step, state, contract.batch_axes, **common)
    got = runtime.translate_batch(texts, beam_size=4, num_hypotheses=2, max_decoding_length=max_len)
    assert [[t.ids for t in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]
    np.testing.assert_allclose([t.score for h in got for t in h], [h.score for w in want for h in w],
                               rtol=SCORE_RTOL)


def test_sampling_and_attention_run_through_the_contract(foreign):
    model, adapter, path = foreign
    runtime = Seq2Seq.load(path)
    first = runtime.translate_batch(TEXTS[:4], sampling_topk=0, seed=3)
    assert first == runtime.translate_batch(TEXTS[:4], sampling_topk=0, seed=3)  # seeded: repeatable
    if runtime.contract.has_attention:
        found = runtime.translate_batch(TEXTS[:2], return_attention=True)
        width = adapter.fixed_source_len or max(
            encode_sources(TEXTS[:2], runtime.vocabularies["source"], runtime.spec, runtime.contract)[1])
        assert found[0][0].attention.shape == (len(found[0][0].ids), width)


def test_the_step_loop_and_the_greedy_loop_agree(foreign):
    _, _, path = foreign
    fused, plain = Seq2Seq.load(path), Seq2Seq.load(path, fused=False)
    assert fused.has_fused and not plain.has_fused
    assert [t[0].ids for t in fused.translate_batch(TEXTS)] == [t[0].ids for t in plain.translate_batch(TEXTS)]


def test_the_models_own_special_ids_are_kept(foreign):
    _, adapter, path = foreign
    runtime = Seq2Seq.load(path)
    assert runtime.vocabularies["target"].ids == adapter.target_vocab.ids
    assert runtime.contract.specials == adapter.target_vocab.ids
    text = runtime.translate_batch([WORDS[0]])[0][0]
    assert all(i not in adapter.target_vocab.ids.ids for i in text.ids)


def test_a_word_the_vocabulary_lacks_is_a_bad_text_or_its_unk(foreign):
    _, adapter, path = foreign
    runtime = Seq2Seq.load(path)
    texts = [WORDS[0], f"{WORDS[1]} zebra"]
    if adapter.source_vocab.ids.unk is not None:  # read as unk, decoded like any other text
        assert len(runtime.translate_batch(texts)) == 2
        return
    with pytest.raises(InputError, match=r"^texts\[1\]: text 'green zebra': token 'zebra' is not in the "
                                         "vocabulary, which has no unknown-token id"):
        runtime.translate_batch(texts)


def test_greedy_search_over_the_pytorch_side_is_the_models_own_decode(foreign):
    model, adapter, _ = foreign
    adapted: Adapted = probe(adapter)
    ids, lengths = AdaptedModel(adapted).sources(5, 6, seed=4)
    state, step = AdaptedModel(adapted).steps(ids, lengths)
    contract = adapted.contract
    found = greedy_search(step, state, contract.batch_axes, 5, contract.specials.bos, contract.specials.eos,
                          max_decoding_length=adapter.max_decoding_length)
    assert [h.tokens for h in found] == model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths),
                                                      adapter.max_decoding_length)
    assert isinstance(AdaptedEncoder(adapter), torch.nn.Module) and isinstance(AdaptedStep(adapter, False),
                                                                               torch.nn.Module)


def test_io_binding_decodes_the_same(foreign):
    """IO binding (forced on the CPU, as the CUDA path runs it) keeps the contract's fed-back state bound."""
    _, _, path = foreign
    plain, bound = Seq2Seq.load(path), Seq2Seq.load(path, io_binding=True, fused=False)
    for options in (dict(), dict(beam_size=3, num_hypotheses=2)):
        assert [[t.ids for t in n] for n in bound.translate_batch(TEXTS, **options)] == \
            [[t.ids for t in n] for n in plain.translate_batch(TEXTS, **options)]


def test_an_unnamed_adapter_is_described_without_a_stutter():
    """verify's hint read "if that is not adapter adapter, or adapter adapter was trained again since"."""
    from dataclasses import replace

    from export.adapter import Seq2SeqAdapter
    from export.api import load_source

    adapter = trained("luong").adapter()
    assert load_source(adapter)[2] == "adapter luong"
    assert load_source(replace(adapter, name=Seq2SeqAdapter.name))[2] == "adapter (unnamed)"
