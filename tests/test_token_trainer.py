"""The token trainer: batches (padding, BOS/EOS, reversed sources, buckets), config validation, learning the toy
translation, exact resume, scheduled sampling, clipping and label smoothing, divergence; recurrent models and the
transformer, and the learning-rate warm-up."""
from __future__ import annotations

import io
import math

import pytest
import torch

from runtime.spec import SpecError
from runtime.vocab import BOS, EOS, PAD, Vocabulary
from training.points.trainer import ConfigError, DivergedError
from training.tokens.batches import BUCKET_BATCHES, TokenBatcher, encode_sources
from training.tokens.builtin import REVERSE, TOKENIZER_OF, generate_reverse
from training.tokens.data import load_text_dataset
from training.tokens.evaluate import evaluate_tokens
from training.tokens.pairs import TextPairs
from training.tokens.trainer import TokenTrainConfig, TokenTrainer, spec_for_text
from training.tokens.transformer import TransformerSeq2Seq

# Measured: this GRU + dot model reaches 9/9 exact after epoch 7 (seed 0, constant lr); 12 epochs leave a margin.
TOY = {"epochs": 12, "batch_size": 3, "lr": 0.03, "lr_decay": 1.0, "seed": 0}
# A tiny transformer for the toy pairs (3 batches an epoch at TOY's batch size).
TINY_TRANSFORMER = {"arch": "transformer", "d_model": 16, "d_ff": 32, "n_heads": 2, "layers": 1}
SPEC_ARGS = ("reverse_source", "arch", "d_model", "d_ff", "n_heads", "layers", "dropout", "norm", "positional")


@pytest.fixture(scope="module")
def toy() -> tuple[TextPairs, Vocabulary, Vocabulary]:
    """The nine notebook pairs and their whitespace vocabularies."""
    train, _ = load_text_dataset("toy-translation")
    return train, Vocabulary.build(train.sources, "whitespace"), Vocabulary.build(train.targets, "whitespace")


@pytest.fixture(scope="module")
def digits() -> tuple[TextPairs, Vocabulary]:
    """600 reverse pairs (3..12 digits) and their char vocabulary, shared by both sides."""
    pairs = generate_reverse(600, 7)
    return pairs, Vocabulary.build(pairs.sources, TOKENIZER_OF[REVERSE])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def toy_trainer(toy, **overrides) -> TokenTrainer:
    """A tiny GRU (or, with arch='transformer' and its sizes, a transformer) on the toy pairs; overrides are config
    fields, or spec fields (SPEC_ARGS)."""
    train, source_vocab, target_vocab = toy
    spec_args = {k: overrides.pop(k) for k in SPEC_ARGS if k in overrides}  # reverse_source: the runtime reads
    if spec_args.get("arch") != "transformer":                               # sources the same way
        spec_args.update(hidden_dim=16, embedding_dim=8, bidirectional=False)
    spec = spec_for_text(train, source_vocab, target_vocab, **spec_args)
    return TokenTrainer(spec, TokenTrainConfig(**{**TOY, **overrides}), train, train, source_vocab, target_vocab)


def weights(trainer: TokenTrainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- batches -------------------------------------------------------------------------------------------------------


def test_batches_are_padded_with_bos_and_eos_in_place():
    vocab = Vocabulary.build(["abc", "xyz"], "char")
    pairs = TextPairs(["abc", "a"], ["xy", "zzzz"])
    data = TokenBatcher(pairs, vocab, vocab)
    a, b, c, x, y, z = (vocab.tokens.index(t) for t in "abcxyz")
    batch = data.batch(torch.tensor([0, 1]))
    assert batch.source.tolist() == [[a, b, c, EOS], [a, EOS, PAD, PAD]]
    assert batch.lengths.tolist() == [4, 2]
    assert batch.target_in.tolist() == [[BOS, x, y, PAD, PAD], [BOS, z, z, z, z]]
    assert batch.target_out.tolist() == [[x, y, EOS, PAD, PAD], [z, z, z, z, EOS]]
    assert all(t.dtype == torch.int64 for t in batch)
    alone = data.batch(torch.tensor([1]))  # cut to its own longest row
    assert alone.source.tolist() == [[a, EOS]] and alone.target_in.shape == (1, 5)


def test_reverse_source_reverses_only_the_real_tokens():
    vocab = Vocabulary.build(["one two three"], "whitespace")
    one, two, three = (vocab.tokens.index(t) for t in ("one", "two", "three"))
    assert encode_sources(("one two three", "two"), vocab, reverse=True) == [[three, two, one, EOS], [two, EOS]]
    data = TokenBatcher(TextPairs(["one two three", "two one"], ["one", "two"]), vocab, vocab, reverse_source=True)
    assert data.source.tolist() == [[three, two, one, EOS], [one, two, EOS, PAD]]
    plain = TokenBatcher(TextPairs(["one two three", "two one"], ["one", "two"]), vocab, vocab)
    assert torch.equal(data.target_in, plain.target_in) and torch.equal(data.lengths, plain.lengths)


def padded_cells(data: TokenBatcher, batches: list[torch.Tensor]) -> int:
    return sum(int((data.batch(index).source == PAD).sum()) for index in batches)


def test_bucketing_cuts_padding_and_is_deterministic(digits):
    pairs, vocab = digits
    data = TokenBatcher(pairs, vocab, vocab)
    plain = data.epoch_batches(8, torch.Generator().manual_seed(3), bucket=False)
    bucketed = data.epoch_batches(8, torch.Generator().manual_seed(3), bucket=True)
    again = data.epoch_batches(8, torch.Generator().manual_seed(3), bucket=True)
    assert len(bucketed) == math.ceil(len(pairs) / 8) and len(pairs) > 8 * BUCKET_BATCHES  # more than one bucket
    assert sorted(torch.cat(bucketed).tolist()) == list(range(len(pairs)))  # every pair once
    assert all(torch.equal(p, q) for p, q in zip(bucketed, again))
    assert padded_cells(data, bucketed) < padded_cells(data, plain) / 4, (padded_cells(data, bucketed),
                                                                         padded_cells(data, plain))
    other = data.epoch_batches(8, torch.Generator().manual_seed(4), bucket=True)
    assert not all(torch.equal(p, q) for p, q in zip(bucketed, other))


@pytest.mark.parametrize("batch_size", [4 * 10**17, 1 << 63, 10**21])
@pytest.mark.parametrize("bucket", [True, False])
def test_a_batch_past_the_data_is_all_of_it_however_large(digits, batch_size, bucket):
    """--batch-size 1e21 (or 2e17 with buckets: times BUCKET_BATCHES) overflowed torch's int64 split: a traceback."""
    pairs, vocab = digits
    data = TokenBatcher(pairs, vocab, vocab)
    (batch,) = data.epoch_batches(batch_size, torch.Generator().manual_seed(3), bucket=bucket)
    assert sorted(batch.tolist()) == list(range(len(pairs)))


def test_spec_for_text_sizes_from_vocabularies_and_longest_pairs(toy):
    train, source_vocab, target_vocab = toy
    spec = spec_for_text(train, source_vocab, target_vocab, hidden_dim=16, embedding_dim=8, cell="lstm", layers=2,
                         bidirectional=True, attention="additive", tie_embeddings=True)
    assert (spec.kind, spec.source_vocab_size, spec.target_vocab_size) == ("tokens", 14, 14)  # 4 specials + 10 words
    assert (spec.input_len, spec.target_len) == (4, 4)  # three words + EOS each side
    assert (spec.cell, spec.layers, spec.bidirectional, spec.attention, spec.tie_embeddings) == (
        "lstm", 2, True, "additive", True)
    assert (spec.arch, spec.d_model) == ("recurrent", 0)


def test_spec_for_text_builds_a_transformer_from_d_model(toy):
    train, source_vocab, target_vocab = toy
    spec = spec_for_text(train, source_vocab, target_vocab, arch="transformer", d_model=16, d_ff=24, n_heads=4,
                         layers=3, norm="post", positional="learned", dropout=0.1)
    assert (spec.arch, spec.d_model, spec.d_ff, spec.n_heads, spec.layers, spec.norm, spec.positional,
            spec.dropout) == ("transformer", 16, 24, 4, 3, "post", "learned", 0.1)
    assert (spec.hidden_dim, spec.embedding_dim, spec.attention, spec.bidirectional) == (16, 16, "multihead", False)
    assert (spec.input_len, spec.target_len, spec.source_vocab_size) == (4, 4, 14)
    with pytest.raises(SpecError, match="do not fit a transformer"):  # a recurrent width given to a transformer
        spec_for_text(train, source_vocab, target_vocab, arch="transformer", d_model=16, d_ff=24, hidden_dim=8)
    with pytest.raises(SpecError, match="are for transformers"):
        spec_for_text(train, source_vocab, target_vocab, d_ff=24)


# -- config ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"epochs": 0}, "'epochs' must be a positive int"),
    ({"batch_size": True}, "'batch_size' must be a positive int"),
    ({"lr": 0}, r"'lr' must be a number in \(0, 1\]"),
    ({"lr": 2.0}, r"'lr' must be a number in \(0, 1\]"),
    ({"lr": float("nan")}, "'lr'"),
    ({"lr_decay": 0.0}, r"'lr_decay' must be a number in \(0, 1\]"),
    ({"lr_decay": 1.5}, "'lr_decay'"),
    ({"seed": 1.5}, "'seed' must be an int"),
    ({"clip": -1.0}, "'clip' must be a finite number >= 0"),
    ({"clip": float("inf")}, "'clip'"),
    ({"label_smoothing": 1.0}, r"'label_smoothing' must be in \[0, 1\)"),
    ({"teacher_forcing": 1.5}, r"'teacher_forcing' must be in \[0, 1\]"),
    ({"bucket": "yes"}, "'bucket' must be true or false"),
    ({"warmup": -1}, "'warmup' must be an int >= 0"),
    ({"warmup": 2.5}, "'warmup' must be an int >= 0"),
    ({"warmup": True}, "'warmup' must be an int >= 0"),
])
def test_config_refuses_bad_values_in_one_line(fields, message):
    with pytest.raises(ConfigError, match=message) as info:
        TokenTrainConfig(**fields)
    assert "\n" not in str(info.value)


def test_config_round_trips_strictly():
    config = TokenTrainConfig(epochs=3, clip=0.0, teacher_forcing=0.5, bucket=False)
    assert TokenTrainConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="fields"):
        TokenTrainConfig.from_dict({**config.to_dict(), "momentum": 0.9})
    with pytest.raises(ConfigError, match="fields"):
        TokenTrainConfig.from_dict({k: v for k, v in config.to_dict().items() if k != "clip"})
    older = {k: v for k, v in config.to_dict().items() if k != "warmup"}  # saved before warm-up existed
    assert TokenTrainConfig.from_dict(older) == config


def test_warmup_ramps_the_lr_linearly_then_decays_per_epoch():
    config = TokenTrainConfig(lr=0.01, lr_decay=0.5, warmup=4)
    ramp = [config.learning_rate(0, step) for step in range(6)]
    assert ramp == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01], rel=1e-12)
    assert config.learning_rate(1, 1) == pytest.approx(0.01 * 0.5 * 2 / 4, rel=1e-12)  # both apply
    assert config.learning_rate(2, 9) == pytest.approx(0.01 * 0.25, rel=1e-12)
    plain = TokenTrainConfig(lr=0.01, lr_decay=0.5)
    assert [plain.learning_rate(e, 0) for e in range(3)] == [0.01, 0.01 * 0.5, 0.01 * 0.25]


def test_the_trainer_counts_steps_and_trains_at_the_scheduled_lr(toy):
    trainer = toy_trainer(toy, epochs=2, warmup=100, lr_decay=0.5)
    trainer.fit(progress=False)
    assert trainer.steps == 6  # 9 pairs in batches of 3, two epochs
    assert trainer.optimizer.param_groups[0]["lr"] == trainer.config.learning_rate(1, 5)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.03 * 0.5 * 6 / 100)


def test_trainer_refuses_a_spec_that_does_not_fit_the_vocabularies(toy):
    train, source_vocab, target_vocab = toy
    smaller = Vocabulary.build(train.sources[:3], "whitespace")
    spec = spec_for_text(train, smaller, target_vocab, hidden_dim=8, embedding_dim=4)
    with pytest.raises(ConfigError, match="spec_for_text"):
        TokenTrainer(spec, TokenTrainConfig(), train, train, source_vocab, target_vocab)


# -- training --------------------------------------------------------------------------------------------------------


def test_learns_the_toy_translation_exactly(toy):
    trainer = toy_trainer(toy)
    history = trainer.fit(progress=False)
    assert set(history) == {"train_loss", "val_exact", "val_token"} and len(history["val_exact"]) == TOY["epochs"]
    assert history["val_exact"][-1] == 1.0 and history["val_token"][-1] == 1.0, history
    assert history["train_loss"][-1] < history["train_loss"][0] / 10
    train, source_vocab, target_vocab = toy
    assert evaluate_tokens(trainer.model, train, source_vocab, target_vocab) == (1.0, 1.0)
    decoded = trainer.model.greedy(*TokenBatcher(train, source_vocab, target_vocab).batch(torch.arange(9))[:2], 8)
    assert [target_vocab.decode(d) for d in decoded] == list(train.targets)


def test_a_transformer_trains(toy):
    trainer = toy_trainer(toy, **TINY_TRANSFORMER, epochs=6, warmup=3)  # measured: loss 2.61 -> 0.88
    assert isinstance(trainer.model, TransformerSeq2Seq)
    history = trainer.fit(progress=False)
    assert history["train_loss"][-1] < history["train_loss"][0] / 2, history
    assert history["val_token"][-1] > history["val_token"][0], history


def test_scheduled_sampling_trains_a_transformer(toy):
    forced = toy_trainer(toy, **TINY_TRANSFORMER, epochs=2)
    forced.fit(progress=False)
    sampled = toy_trainer(toy, **TINY_TRANSFORMER, epochs=2, teacher_forcing=0.3)
    sampled.fit(progress=False)  # one cached step at a time, the model's own argmax fed back
    assert all(math.isfinite(v) for v in sampled.history["train_loss"])
    assert sampled.history["train_loss"][-1] < sampled.history["train_loss"][0]
    assert not same_weights(weights(forced), weights(sampled))


@pytest.mark.parametrize("overrides", [
    {},
    {"teacher_forcing": 0.5, "reverse_source": True, "bucket": False, "lr_decay": 0.7},
    {**TINY_TRANSFORMER, "dropout": 0.1, "warmup": 10, "lr_decay": 0.7},  # resumed at step 6, mid-ramp
])
def test_resume_after_an_epoch_equals_an_uninterrupted_run(toy, overrides):
    whole = toy_trainer(toy, epochs=4, **overrides)
    whole.fit(progress=False)
    first = toy_trainer(toy, epochs=2, **overrides)
    first.fit(progress=False)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)  # through bytes, as a checkpoint file would carry it
    torch.manual_seed(12345)  # whatever ran in between must not matter
    resumed = toy_trainer(toy, epochs=4, **overrides)
    resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
    assert resumed.epoch == 2
    assert resumed.steps == first.steps == 6
    resumed.fit(progress=False)
    assert same_weights(weights(resumed), weights(whole))
    assert resumed.history == whole.history
    assert resumed.steps == whole.steps == 12


def test_a_state_saved_before_warmup_resumes_with_the_counted_steps(toy):
    first = toy_trainer(toy, epochs=2)
    first.fit(progress=False)
    state = first.state_dict()
    del state["optimizer_steps"]
    state["config"] = {k: v for k, v in state["config"].items() if k != "warmup"}
    resumed = toy_trainer(toy, epochs=3)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.steps) == (2, 6)  # ceil(9 / 3) steps an epoch


def test_resume_refuses_other_options_and_vocabularies(toy):
    trainer = toy_trainer(toy, epochs=1)
    trainer.fit(progress=False)
    state = trainer.state_dict()
    with pytest.raises(ConfigError, match="original training options"):
        toy_trainer(toy, lr=0.01).load_state_dict(state)
    with pytest.raises(ConfigError, match="format_version"):
        toy_trainer(toy).load_state_dict({**state, "format_version": 99})
    with pytest.raises(ConfigError, match="vocab_sha256: source '0', this run [0-9a-f]{12}.*the vocabularies differ: "
                                          "a --tokenizer file or the --data they were built from changed"):
        toy_trainer(toy).load_state_dict({**state, "vocab_sha256": {"source": "0", "target": "0"}})


@pytest.mark.parametrize("overrides", [{"teacher_forcing": 0.5}, {"teacher_forcing": 0.0}, {"clip": 0.0},
                                       {"lr_decay": 0.5}, {"label_smoothing": 0.1}, {"bucket": False}])
def test_each_option_changes_training(toy, overrides):
    base = toy_trainer(toy, epochs=2, clip=0.5)  # clip small enough to bite on these gradients
    base.fit(progress=False)
    other = toy_trainer(toy, epochs=2, **{"clip": 0.5, **overrides})
    other.fit(progress=False)
    assert all(math.isfinite(v) for v in other.history["train_loss"])
    assert not same_weights(weights(base), weights(other))
    assert other.history["train_loss"] != base.history["train_loss"]


def test_reverse_source_changes_training(digits):
    pairs, vocab = digits  # the toy sources are palindromes ("one is one"), digit strings are not
    pairs = pairs.subset(range(32))
    runs = [TokenTrainer(spec_for_text(pairs, vocab, vocab, hidden_dim=8, embedding_dim=4, reverse_source=r),
                         TokenTrainConfig(epochs=1, batch_size=8), pairs, pairs, vocab, vocab) for r in (False, True)]
    for run in runs:
        run.fit(progress=False)
    assert not same_weights(weights(runs[0]), weights(runs[1]))


def test_the_same_seed_trains_the_same_weights(toy):
    a, b = toy_trainer(toy, epochs=2, teacher_forcing=0.5), toy_trainer(toy, epochs=2, teacher_forcing=0.5)
    a.fit(progress=False)  # draws its coins from its own generator, so b's run does not depend on a's
    torch.rand(7)
    b.fit(progress=False)
    assert same_weights(weights(a), weights(b)) and a.history == b.history


def test_a_non_finite_loss_raises_diverged_and_keeps_no_epoch(toy):
    trainer = toy_trainer(toy)
    with torch.no_grad():
        trainer.model.decoder.output.bias[EOS] = float("inf")  # inf logits -> NaN log-probs -> NaN loss
    with pytest.raises(DivergedError, match="diverged in epoch 1.*lower the learning rate"):
        trainer.fit(progress=False)
    assert trainer.epoch == 0 and trainer.history == {"train_loss": [], "val_exact": [], "val_token": []}
    assert isinstance(DivergedError("x"), ConfigError)


def test_a_warmup_longer_than_the_run_is_said(capsys):
    """--warmup 1e23 was taken without a word: the learning rate never left ~0."""
    from cli.train_tokens import warn_long_warmup

    warn_long_warmup(TokenTrainConfig(epochs=2, batch_size=64, warmup=10**23), 1000, 1)
    said = capsys.readouterr().err
    assert said == (f"warning: --warmup {10**23} is more optimizer steps than the run takes (32: 2 epoch(s) of 16), "
                    "so the learning rate stays below --lr 0.003 to the end\n"), said
    warn_long_warmup(TokenTrainConfig(epochs=2, batch_size=64, warmup=32), 1000, 1)  # reached at the last step
    assert capsys.readouterr().err == ""
    warn_long_warmup(TokenTrainConfig(epochs=2, batch_size=64, warmup=20), 1000, 2)  # a process's shard: 8 a epoch
    assert "(16: 2 epoch(s) of 8)" in capsys.readouterr().err
    warn_long_warmup(TokenTrainConfig(epochs=1, batch_size=64, warmup=20), 1000, 1, default=True)  # not typed
    assert capsys.readouterr().err.startswith("warning: --warmup 20 (the default) is more optimizer steps")
