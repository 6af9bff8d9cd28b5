"""Token models end to end: export_model ships graphs + vocabularies with parity checked, and
Seq2Seq.translate_batch decodes texts exactly as the PyTorch reference does."""
from __future__ import annotations

import hashlib
import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from export.api import export_model
from export.errors import ExportError
from runtime.errors import InputError, IntegrityError
from runtime.model import Seq2Seq
from runtime.spec import ModelSpec
from runtime.specials import BOS, PAD
from runtime.vocab import Vocabulary
from training.tokens.base import NEVER_LOGIT
from training.tokens.builtin import toy_translation
from training.tokens.recurrent import TokenSeq2Seq

from support.models import save_token_checkpoint

PAIRS, _ = toy_translation()  # (train, test): the same nine pairs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def token_export(recurrent_export) -> tuple[TokenSeq2Seq, Vocabulary, Vocabulary, Path]:
    """The session's bidirectional GRU + additive-attention export, as (model, source, target, path)."""
    return recurrent_export.model, recurrent_export.source, recurrent_export.target, recurrent_export.path


def test_export_ships_hashed_vocabularies_and_passes_parity(token_export):
    _, _, _, out = token_export
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["vocabularies"]) == ["source", "target"]
    assert manifest["parity"]["passed"] and {r["output"] for r in manifest["parity"]["cases"]} == {
        "step.log_probs", "greedy.ids", "greedy_loop.ids", "beam.ids", "beam_step.ids", "beam_step.scores"}
    assert sorted(p.name for p in out.iterdir()) == ["beam_step.onnx", "decoder_step.onnx", "encoder.onnx",
                                                     "greedy_loop.onnx", "manifest.json", "source_vocab.json",
                                                     "target_vocab.json"]


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


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("export", ["recurrent_export", "transformer_export"])
@pytest.mark.parametrize("inputs", [1, 20])  # 20: the wide beam graph
def test_a_beam_wider_than_the_vocabulary_returns_no_never_output_token(request, export, fused, inputs):
    """<pad> and <s> sit at a log-prob of -1e4 in the step (NEVER_LOGIT), not -inf: a beam with fewer real
    candidates than slots took them in as hypotheses (' <pad>' in the n-best) until translate dropped them."""
    path = request.getfixturevalue(export).path
    runtime = Seq2Seq.load(path, provider="cpu", fused=fused)
    size = runtime.spec.target_vocab_size
    for length in (1, 3):
        found = runtime.translate_batch(["one is one"] * inputs, beam_size=size, num_hypotheses=size,
                                        max_decoding_length=length)
        for hyps in found:
            assert hyps and all({PAD, BOS}.isdisjoint(h.ids) for h in hyps), [h.ids for h in hyps]
            assert all(h.log_prob > NEVER_LOGIT / 2 for h in hyps)
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len(found[0]) <= size - 2 if length == 1 else True  # one token: at most the real ids
    plain = runtime.translate_batch(["one is one"], beam_size=4, num_hypotheses=4, max_decoding_length=3)
    assert len(plain[0]) == 4  # a beam with enough real candidates keeps its whole n-best


@pytest.mark.parametrize("export", ["recurrent_export", "transformer_export"])
def test_sampling_at_any_temperature_returns_no_never_output_token(request, export):
    """At a temperature of 1e4 or more the never-output ids' -1e4 reads as ~0, and sampling drew them; at a tiny
    one, a row whose every log-prob / T overflowed took id 0 (<pad>)."""
    runtime = Seq2Seq.load(request.getfixturevalue(export).path, provider="cpu")
    for temperature in (1e30, 1e6, 2.3e-308):
        found = runtime.translate_batch(["one is one", "two"] * 20, sampling_temperature=temperature,
                                        sampling_topk=0, seed=1, max_decoding_length=6)
        assert all({PAD, BOS}.isdisjoint(h[0].ids) for h in found), temperature
    greedy = runtime.translate_batch(["one is one", "two"], max_decoding_length=6)
    coldest = runtime.translate_batch(["one is one", "two"], sampling_temperature=2.3e-308, sampling_topk=0, seed=1,
                                      max_decoding_length=6)
    assert [h[0].ids for h in coldest] == [h[0].ids for h in greedy]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_top_p_and_temperature_at_top_k_1_change_nothing(token_export, beam_size):
    """As in CTranslate2, sampling is on only where sampling_topk is other than 1: at 1, the default, the top token
    is kept whatever sampling_topp and sampling_temperature say, so the decode is the plain search's (a beam's was
    refused as sampling)."""
    runtime = Seq2Seq.load(token_export[3], provider="cpu")
    texts = ["one is one", "two", "one two"]
    plain = runtime.translate_batch(texts, beam_size=beam_size, num_hypotheses=beam_size, max_decoding_length=6)
    for options in ({"sampling_temperature": 0.3}, {"sampling_topp": 0.2}, {"sampling_temperature": 7.0,
                                                                            "sampling_topp": 0.5, "seed": 3}):
        found = runtime.translate_batch(texts, beam_size=beam_size, num_hypotheses=beam_size,
                                        max_decoding_length=6, **options)
        assert [[(h.ids, h.log_prob) for h in hyps] for hyps in found] == \
            [[(h.ids, h.log_prob) for h in hyps] for hyps in plain], options


@pytest.mark.parametrize("texts", [["one"], ["one", "two"]])  # one row is decoded without flushing denormals
@pytest.mark.parametrize("option", ["sampling_topp", "sampling_temperature"])
def test_a_subnormal_sampling_option_is_refused_whatever_the_batch(token_export, texts, option):
    runtime = Seq2Seq.load(token_export[3], provider="cpu")
    with pytest.raises(InputError, match=rf"^{option} must be at least 2.225e-308 .* got 1e-320$"):
        runtime.translate_batch(texts, sampling_topk=0, **{option: 1e-320})


@pytest.mark.parametrize(("texts", "options", "message"), [
    ("one is one", {}, "wrap one text as [text]"),
    ((t for t in ["one"]), {}, "got <generator object .*>; pass them as a list"),
    ([""], {}, "texts[0]: expected a non-empty string"),
    (["ok", "caf\udce9"], {}, "texts[1]: expected Unicode text, got a lone surrogate U.DCE9 at character 3"),
    (["one " * 2000], {}, "more than the 1024 the runtime reads of one source"),
    (["one"], {"beam": 3}, "unknown options ['beam']"),
    (["one"], {"beam_size": 3, "sampling_topk": 5}, "sampling needs beam_size 1"),
    (["one"], {"beam_size": 0}, "beam_size must be an int in [1, 256]"),
    (["one"], {"sampling_topp": 1.5, "sampling_topk": 0}, "sampling_topp"),
    (["one"], {"max_decoding_length": 10_001}, "max_decoding_length: 10001 is more than 10000, the most tokens"),
    (["one"], {"max_decoding_length": 2**70}, "is more than 10000"),  # was onnxruntime's failure (or int64's)
    (["one"], {"beam_size": 2, "length_penalty": 2**2000}, "length_penalty must be a finite float"),
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
    actual = hashlib.sha256((copy / "target_vocab.json").read_bytes()).hexdigest()
    with pytest.raises(IntegrityError, match=f"target_vocab.json: sha256 {actual[:16]}\\.\\.\\. does not match the "
                                             "manifest's [0-9a-f]{16}\\.\\.\\.; the file was altered"):
        Seq2Seq.load(copy)


@pytest.mark.parametrize("side, change", [("target", -1), ("source", 2)])
def test_a_vocabulary_of_another_size_than_the_spec_is_refused_at_load(token_export, tmp_path, side, change):
    # Altered with its sha256 updated to match: the graphs' tables still have the spec's size.
    copy = tmp_path / "m"
    shutil.copytree(token_export[3], copy)
    path = copy / f"{side}_vocab.json"
    data = json.loads(path.read_text())
    size = len(data["tokens"])
    data["tokens"] = data["tokens"][:change] if change < 0 else data["tokens"] + [f"new{i}" for i in range(change)]
    path.write_text(json.dumps(data))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["vocabularies"][side]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=f"{side}_vocab.json: holds {size + change} tokens, but the manifest's "
                                             f"spec says {side}_vocab_size {size}"):
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
    from training.tokens.batches import TokenBatcher
    from training.tokens.pairs import TextPairs

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
    from training.tokens.recurrent import torch_steps

    state, step = torch_steps(model, ids, lengths)
    found = greedy_search(step, state, state_batch_axes(model.spec), batch_size=len(ids), bos_id=BOS, eos_id=EOS,
                          max_decoding_length=6)
    return np.array([h.log_prob for h in found])


# ---- the transformer: the same front door, its position table's limits -------------------------------------------

def test_transformer_export_passes_the_full_sequence_parity_over_the_capped_matrix(transformer_export):
    manifest = json.loads((transformer_export.path / "manifest.json").read_text())
    parity = manifest["parity"]
    checks = {"step.log_probs", "sequence.log_probs", "greedy.ids", "greedy_loop.ids", "beam.ids"}
    graphs = ("", "fast.", "wide.")  # the traced graphs, then the fast ones: fused kernels, batched attention
    beam_graph = {g + "beam_graph." + c for g in graphs[1:] for c in ("ids", "scores")}  # the fast ones' beam graphs
    assert parity["passed"] and set(parity["summary"]) == {g + c for g in graphs for c in checks} | beam_graph
    limit = manifest["spec"]["max_positions"]  # 8: the matrix's 12-token sources and 12 steps stop there
    assert max(r["source_len"] for r in parity["cases"]) == limit
    assert {r["target_len"] for r in parity["cases"]} == {limit}


def test_the_full_sequence_rows_fail_for_a_model_that_is_not_the_exported_one(transformer_export):
    import copy

    from export.parity import Tolerance
    from export.tokens.parity import run_token_parity

    other = copy.deepcopy(transformer_export.model)
    with torch.no_grad():
        other.decoder_layers[-1].self_attention.values.bias.add_(0.5)  # only the decoder's self-attention differs
    rows = run_token_parity(other, Seq2Seq.load(transformer_export.path, provider="cpu"), Tolerance())
    sequence = [r for r in rows if r.output == "sequence.log_probs"]
    assert len(sequence) == len({r.case for r in rows}) >= 4  # one per case
    assert not any(r.ok for r in sequence) and min(r.max_abs for r in sequence) > 1e-3


def test_transformer_translates_as_pytorch_decodes(transformer_export):
    from runtime.contract import state_batch_axes
    from runtime.search import beam_search, sample
    from runtime.vocab import BOS, EOS
    from training.tokens.base import torch_steps

    model, source = transformer_export.model, transformer_export.source
    runtime = Seq2Seq.load(transformer_export.path, provider="cpu")
    texts = list(PAIRS.sources[:6])
    ids, lengths = source.encode_batch(texts)
    greedy = runtime.translate_batch(texts)
    assert [t[0].ids for t in greedy] == model.greedy(torch.from_numpy(ids), torch.from_numpy(lengths), max_len=6)
    common = dict(batch_size=len(texts), bos_id=BOS, eos_id=EOS, max_decoding_length=6)
    state, step = torch_steps(model, ids, lengths)
    beam = beam_search(step, state, state_batch_axes(model.spec), beam_size=3, num_hypotheses=3, **common)
    got = runtime.translate_batch(texts, beam_size=3, num_hypotheses=3)  # the cache reordered with the beams
    assert [[t.ids for t in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in beam]
    drawn = sample(step, state, state_batch_axes(model.spec), sampling_topk=0, seed=4, **common)
    assert [t[0].ids for t in runtime.translate_batch(texts, sampling_topk=0, seed=4)] == [h.tokens for h in drawn]


def test_numpy_bools_ask_for_attention_as_bools_do(transformer_export):
    """numpy ints were taken for the int options, but np.True_ for return_attention was refused (found by a fresh
    walk): numpy's bools are taken too, and decode as Python's."""
    model = Seq2Seq.load(transformer_export.path, threads=1)
    asked, plain = (model.translate_batch(["the cat sat"], return_attention=flag)[0][0] for flag in (np.True_, True))
    assert asked.ids == plain.ids and np.array_equal(asked.attention, plain.attention)
    assert model.translate_batch(["the cat sat"], return_attention=np.False_)[0][0].attention is None


def test_transformer_attention_is_the_cross_attention_per_output_token(transformer_export):
    runtime = Seq2Seq.load(transformer_export.path, provider="cpu")
    texts = ["one is one", "two"]
    found = runtime.translate_batch(texts, return_attention=True, min_decoding_length=3)
    for text, hyps in zip(texts, found):
        attention = hyps[0].attention
        assert attention.shape == (len(hyps[0].ids), len(text.split()) + 1)  # its own tokens and eos, not padding
        np.testing.assert_allclose(attention.sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("export", ["recurrent_export", "transformer_export"])
@pytest.mark.parametrize("options", [{}, dict(beam_size=3, num_hypotheses=2), dict(sampling_topk=0, seed=3)],
                         ids=["greedy", "beam", "sampling"])
def test_a_texts_attention_is_its_own_width_whatever_it_is_decoded_beside(request, export, options):
    """A short text decoded beside a longer one gets the attention of its decode alone: its own tokens and eos
    as columns, not the padded batch's (the README's `(output len, source len + 1)`)."""
    runtime = Seq2Seq.load(request.getfixturevalue(export).path, provider="cpu")
    texts = ["two", "one is one is one"]
    together = runtime.translate_batch(texts, return_attention=True, max_decoding_length=5, **options)
    for text, hyps in zip(texts, together):
        alone = runtime.translate_batch([text], return_attention=True, max_decoding_length=5, **options)[0]
        if "seed" in options:  # a seeded sample draws for the whole batch: compare the hypotheses' own shapes
            assert all(h.attention.shape == (len(h.ids), len(text.split()) + 1) for h in hyps)
            continue
        assert [h.ids for h in hyps] == [h.ids for h in alone]
        for got, want in zip(hyps, alone):
            assert got.attention.shape == want.attention.shape == (len(got.ids), len(text.split()) + 1)
            np.testing.assert_allclose(got.attention, want.attention, rtol=1e-5, atol=1e-6)


def test_transformer_decodes_up_to_its_position_table_exactly(transformer_export):
    runtime = Seq2Seq.load(transformer_export.path, provider="cpu")
    limit = runtime.spec.max_positions
    longest = " ".join(["one"] * (limit - 1))  # limit tokens with the closing </s>
    found = runtime.translate_batch([longest], max_decoding_length=limit, min_decoding_length=limit)
    assert len(found[0][0].ids) == limit  # output token t read row t, up to the table's last row


@pytest.mark.parametrize(("texts", "options", "message"), [
    (["one " * 8], {}, "texts[0]: 9 tokens with the closing </s>, more than this transformer's max_positions 8"),
    (["one", "one " * 20], {}, "texts[1]: 21 tokens with the closing </s>, more than this transformer's "
                               "max_positions 8"),
    (["one"], {"max_decoding_length": 9}, "max_decoding_length: 9 is more than this transformer's max_positions 8"),
    ([], {"max_decoding_length": 9}, "pass max_decoding_length <= 8"),
    (["one"], {"max_decoding_length": 0}, "max_decoding_length must be an int >= 1"),
])
def test_transformer_refuses_what_its_position_table_cannot_hold(transformer_export, texts, options, message):
    runtime = Seq2Seq.load(transformer_export.path, provider="cpu")
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("(", r"\(")) as info:
        runtime.translate_batch(texts, **options)
    assert "\n" not in str(info.value)


def test_a_default_length_beyond_the_position_table_is_refused_by_name():
    from runtime.decode_options import check_decoding_length

    spec = ModelSpec(kind="tokens", arch="transformer", d_model=8, d_ff=8, n_heads=2, source_vocab_size=9,
                     target_vocab_size=9, target_len=12, max_positions=10)
    with pytest.raises(InputError, match="the default, the spec's target_len 12, is more than this transformer's "
                                         "max_positions 10"):
        check_decoding_length(spec, None)
    assert check_decoding_length(spec, 10) == 10
    recurrent = ModelSpec(kind="tokens", hidden_dim=4, embedding_dim=4, source_vocab_size=9, target_vocab_size=9)
    assert check_decoding_length(recurrent, 5000) == 5000  # no position table, no such bound


def test_verify_compares_a_transformer_checkpoint_with_its_export(transformer_export, tmp_path):
    """`seq2onnx export` then `seq2onnx verify` on a transformer checkpoint: the full-sequence rows are part of it,
    and texts beyond the position table are left out with a note (the runtime refuses them)."""
    from click.testing import CliRunner

    from cli.export import export_command, verify_command
    from training.tokens.data import load_text_dataset

    train, _ = load_text_dataset("toy-translation")
    checkpoint = save_token_checkpoint(tmp_path / "ck", transformer_export.model,
                                       (transformer_export.source, transformer_export.target))
    exported = CliRunner().invoke(export_command, [str(checkpoint), "--out", str(tmp_path / "model")])
    assert exported.exit_code == 0, exported.output
    verified = CliRunner().invoke(verify_command, [str(checkpoint), str(tmp_path / "model")])
    assert verified.exit_code == 0, verified.output
    assert "sequence.log_probs" in verified.output and "test b8 s4" in verified.output
    assert "all " in verified.output and "checks within" in verified.output
    tsv = tmp_path / "long.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(train.sources, train.targets)) + "one " * 9 + "\tx\n")
    with_long = CliRunner().invoke(verify_command, [str(checkpoint), str(tmp_path / "model"), "--data", str(tsv)])
    assert with_long.exit_code == 0, with_long.output
    assert "longer than the transformer's max_positions 8" in with_long.output


def test_verify_of_a_recurrent_checkpoint_and_a_transformer_export_names_the_architectures(
        recurrent_export, transformer_export, tmp_path):
    """Two kinds of model differ in every field of the other's kind (d_ff 0 against 256 ...): the refusal names
    the architectures only."""
    from click.testing import CliRunner

    from cli.export import verify_command

    checkpoint = save_token_checkpoint(tmp_path / "ck", recurrent_export.model,
                                       (recurrent_export.source, recurrent_export.target))
    result = CliRunner().invoke(verify_command, [str(checkpoint), str(transformer_export.path)])
    assert result.exit_code == 1, result.output
    assert "hold different models (arch: 'recurrent' vs 'transformer')" in result.output, result.output


@pytest.mark.parametrize("options", [dict(beam_size=5), dict(sampling_topk=3), dict()])
def test_a_cancel_already_set_stops_a_recurrent_decode_before_its_encoder_runs(token_export, options):
    """The step loops asked `cancel` first at their first step, after the encoder: a cancel already set ran the
    encoder (watched, so it was stopped when the watchdog's thread asked in time, and ran whole when it did not:
    a flaky test in CI). It is now asked on the caller's thread before the encoder, as before the one-call graphs."""
    from runtime.errors import Cancelled

    runtime = Seq2Seq.load(token_export[3], provider="cpu", fused=False)
    steps, ran = runtime._token_steps, []
    encoder = steps._encoder
    steps._encoder = lambda *args: ran.append(1) or encoder(*args)  # a witness: it runs the real session
    with pytest.raises(Cancelled, match=r"^decode: cancelled by its caller before it started"):
        runtime.translate_batch(["one is one", "two"] * 3, cancel=lambda: True, **options)
    assert not ran
    assert runtime.translate_batch(["two"], **options) and ran == [1]  # the witness sees a run


def test_a_cancel_set_while_a_recurrent_encoder_runs_stops_the_decode_before_its_greedy_loop(token_export):
    """A recurrent model's greedy decode is two graphs, the encoder and the loop. The watchdog asks a run's cancel
    only from a poll into it, so a cancel set during a short encoder was never asked: the loop ran whole and the
    call answered. It is now asked on the caller's thread between the two."""
    from runtime.errors import Cancelled

    runtime = Seq2Seq.load(token_export[3], provider="cpu", threads=1)
    greedy = runtime._token_steps.greedy
    assert greedy is not None and not greedy.reads_sources
    loop, ran = greedy._run, []
    greedy._run = lambda *args: ran.append(1) or loop(*args)  # a witness: it runs the real session
    answers = iter([False])  # go on before the encoder, stop after it
    with pytest.raises(Cancelled, match=r"^decode: cancelled by its caller between two steps"):
        runtime.translate_batch(["one is one", "two"], cancel=lambda: next(answers, True))
    assert not ran
    assert runtime.translate_batch(["two"]) and ran == [1]  # the witness sees a run


@pytest.mark.parametrize("options", [dict(beam_size=5), dict(sampling_topk=3), dict()])
def test_a_cancel_reaches_a_recurrent_decode_while_its_encoder_runs(token_export, options):
    """A cancel that turns true once the encoder runs stops it there: its run is watched, as the loop graphs' are
    (a call of 8000 texts of the dates model ran its encoder whole, 4 s, before the first step's question). Here
    cancel says stop only on the watchdog's thread, and 16000 texts keep the encoder busy ~0.1 s."""
    from runtime.errors import Cancelled

    runtime = Seq2Seq.load(token_export[3], provider="cpu", fused=False, threads=1)
    caller = threading.get_ident()
    with pytest.raises(Cancelled, match=r"^encoder\.onnx: cancelled by its caller while it ran"):
        runtime.translate_batch(["one is one two"] * 16000, cancel=lambda: threading.get_ident() != caller,
                                **options)
