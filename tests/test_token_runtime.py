"""Token models end to end: export_model ships graphs + vocabularies with parity checked, and
Seq2Seq.translate_batch decodes texts exactly as the PyTorch reference does."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from export.api import export_model
from export.errors import ExportError
from runtime.errors import InputError, IntegrityError
from runtime.model import Seq2Seq
from runtime.spec import ModelSpec
from runtime.vocab import Vocabulary
from training.recurrent import TokenSeq2Seq
from training.text_data import toy_translation

PAIRS, _ = toy_translation()  # (train, test): the same nine pairs


@pytest.fixture(scope="module")
def token_export(tmp_path_factory) -> tuple[TokenSeq2Seq, Vocabulary, Vocabulary, Path]:
    """A seeded GRU + additive-attention token model on the toy corpus's vocabularies, exported once."""
    source = Vocabulary.build(PAIRS.sources, "whitespace")
    target = Vocabulary.build(PAIRS.targets, "whitespace")
    spec = ModelSpec(kind="tokens", cell="gru", bidirectional=True, attention="additive", hidden_dim=8,
                     embedding_dim=6, source_vocab_size=len(source), target_vocab_size=len(target), target_len=6)
    torch.manual_seed(0)
    model = TokenSeq2Seq(spec).eval()
    out = export_model(model, tmp_path_factory.mktemp("tok") / "model", vocabularies=(source, target))
    return model, source, target, out


def test_export_ships_hashed_vocabularies_and_passes_parity(token_export):
    _, _, _, out = token_export
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["vocabularies"]) == ["source", "target"]
    assert manifest["parity"]["passed"] and {r["output"] for r in manifest["parity"]["cases"]} == {
        "step.log_probs", "greedy.ids", "beam.ids"}
    assert sorted(p.name for p in out.iterdir()) == ["decoder_step.onnx", "encoder.onnx", "manifest.json",
                                                     "source_vocab.json", "target_vocab.json"]


def test_translate_greedy_equals_the_pytorch_reference(token_export):
    model, source, target, out = token_export
    runtime = Seq2Seq.load(out)
    texts = list(PAIRS.sources[:5])
    got = runtime.translate_batch(texts)
    ids, lengths = source.encode_batch(texts)
    reference = model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), max_len=6)
    assert [t[0].ids for t in got] == reference
    assert [t[0].text for t in got] == [target.decode(r) for r in reference]


def test_beam_n_best_and_seeded_sampling(token_export):
    runtime = Seq2Seq.load(token_export[3])
    nbest = runtime.translate_batch(["one is one", "two is two"], beam_size=4, num_hypotheses=3)
    assert all(len(h) == 3 and [t.score for t in h] == sorted((t.score for t in h), reverse=True) for h in nbest)
    first = runtime.translate_batch(["one is one"] * 3, sampling_topk=0, seed=5)
    assert first == runtime.translate_batch(["one is one"] * 3, sampling_topk=0, seed=5)
    attention = runtime.translate_batch(["one is one"], return_attention=True)[0][0].attention
    assert attention.shape[1] == len("one is one".split()) + 1  # the source's tokens and its eos


@pytest.mark.parametrize(("texts", "options", "message"), [
    ("one is one", {}, "wrap one text as [text]"),
    ([""], {}, "texts[0]: expected a non-empty string"),
    (["one " * 2000], {}, "more than the 1024 allowed"),
    (["one"], {"beam": 3}, "unknown options ['beam']"),
    (["one"], {"beam_size": 3, "sampling_topk": 5}, "sampling needs beam_size 1"),
    (["one"], {"beam_size": 0}, "beam_size must be an int >= 1"),
    (["one"], {"sampling_topp": 1.5, "sampling_topk": 0}, "sampling_topp"),
])
def test_bad_translate_inputs_are_one_line_input_errors(token_export, texts, options, message):
    runtime = Seq2Seq.load(token_export[3])
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("(", r"\(")) as info:
        runtime.translate_batch(texts, **options)
    assert "\n" not in str(info.value)


def test_unknown_words_map_to_unk_and_still_decode(token_export):
    runtime = Seq2Seq.load(token_export[3])
    assert len(runtime.translate_batch(["seven is eleven"])) == 1


def test_each_kind_refuses_the_other_call(token_export, exports):
    with pytest.raises(InputError, match="token model, which takes texts"):
        Seq2Seq.load(token_export[3]).predict([[[0.0, 0.0]]])
    with pytest.raises(InputError, match="point model, which takes numeric sources"):
        Seq2Seq.load(exports["dot"].path).translate_batch(["one is one"])


def test_a_tampered_vocabulary_is_refused(token_export, tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(token_export[3], copy)
    data = json.loads((copy / "target_vocab.json").read_text())
    data["tokens"][5], data["tokens"][6] = data["tokens"][6], data["tokens"][5]
    (copy / "target_vocab.json").write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="target_vocab.json: sha256 does not match"):
        Seq2Seq.load(copy)


def test_export_refuses_missing_or_mismatched_vocabularies(token_export, tmp_path):
    model, source, target, _ = token_export
    with pytest.raises(ExportError, match="needs \\(source, target\\) Vocabulary"):
        export_model(model, tmp_path / "a")
    with pytest.raises(ExportError, match="do not match"):
        export_model(model, tmp_path / "b", vocabularies=(Vocabulary.build(["x y"], "whitespace"), target))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_reversed_source_multihead_model_reads_texts_as_it_was_trained(tmp_path):
    """spec.reverse_source travels in the manifest: the runtime reverses the source tokens as the trainer did."""
    from training.text_data import TextPairs
    from training.token_trainer import TokenBatcher

    source = Vocabulary.build(PAIRS.sources, "whitespace")
    target = Vocabulary.build(PAIRS.targets, "whitespace")
    spec = ModelSpec(kind="tokens", cell="lstm", attention="multihead", n_heads=2, hidden_dim=8, embedding_dim=6,
                     source_vocab_size=len(source), target_vocab_size=len(target), target_len=6, reverse_source=True)
    torch.manual_seed(3)
    model = TokenSeq2Seq(spec).eval()
    out = export_model(model, tmp_path / "model", vocabularies=(source, target))
    runtime = Seq2Seq.load(out)
    assert runtime.spec.reverse_source
    texts = ["one is two", "two two is", "is one one two", "three is one"]  # not palindromes, unlike the corpus
    pairs = TextPairs(texts, ["1"] * len(texts))
    batch = TokenBatcher(pairs, source, target, reverse_source=True).batch(torch.arange(len(texts)))
    assert batch.source[0, :3].tolist() == [source.encode(w, add_eos=False)[0] for w in ("two", "is", "one")]
    forward_batch = TokenBatcher(pairs, source, target).batch(torch.arange(len(texts)))
    reference, forward = (_greedy_log_probs(model, b.source.numpy(), b.lengths.numpy()) for b in (batch, forward_batch))
    assert np.abs(reference - forward).max() > 1e-3  # the order matters to this model, so the check below can tell
    got = np.array([t[0].log_prob for t in runtime.translate_batch(texts, max_decoding_length=6)])
    np.testing.assert_allclose(got, reference, atol=1e-4)


def _greedy_log_probs(model: TokenSeq2Seq, ids, lengths):
    """Summed log-probs of the greedy decode PyTorch makes of these ids."""
    from runtime.contract import state_batch_axes
    from runtime.search import greedy_search
    from runtime.vocab import BOS, EOS
    from training.recurrent import torch_steps

    state, step = torch_steps(model, ids, lengths)
    found = greedy_search(step, state, state_batch_axes(model.spec), batch_size=len(ids), bos_id=BOS, eos_id=EOS,
                          max_decoding_length=6)
    return np.array([h.log_prob for h in found])
