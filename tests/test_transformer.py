"""The transformer token model in PyTorch: the cached step equals the full-sequence decoder, masks hold (causal,
padding), the attention math is the seeds' (scaled by sqrt(d_k), masked to -inf), positions are the sinusoids,
and the spec's transformer fields are checked."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.spec import DEFAULT_MAX_POSITIONS, ModelSpec, SpecError
from training.build import build_token_model
from training.tokens.base import BOS_ID, EOS_ID, PAD_ID
from training.tokens.recurrent import sequence_loss
from training.tokens.transformer import (
    MultiHeadAttention,
    PositionalEncoding,
    TransformerSeq2Seq,
    scaled_dot_product,
)

VOCAB = 13
ATOL = 1e-5
# The property's random models reach log-probs of -30 and more, where float32 rounding alone is ~4e-6, and PyTorch's
# threaded reductions round differently from run to run: an absolute bound alone failed once in hundreds of runs.
PROPERTY_RTOL = 1e-5
PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tf_spec(**fields) -> ModelSpec:
    """A tiny transformer spec."""
    base = dict(kind="tokens", arch="transformer", d_model=16, d_ff=24, n_heads=2, layers=2,
                source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    return ModelSpec(**{**base, **fields})


def model_for(spec: ModelSpec, seed: int = 0) -> TransformerSeq2Seq:
    torch.manual_seed(seed)
    return TransformerSeq2Seq(spec).eval()


def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(map(len, rows))
    return torch.tensor([r + [PAD_ID] * (length - len(r)) for r in rows]), torch.tensor([len(r) for r in rows])


def stepped(model: TransformerSeq2Seq, source: torch.Tensor, lengths: torch.Tensor,
            target_in: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Teacher-forced log-probs (N, T, V) one cached step at a time, and the final state."""
    state = model.encode(source, lengths)
    out = []
    for t in range(target_in.shape[1]):
        log_probs, state, _ = model.step(target_in[:, t], state)
        out.append(log_probs)
    return torch.stack(out, dim=1), state


SPEC_VARIANTS = [dict(), dict(layers=1, norm="post"), dict(positional="learned", tie_embeddings=True),
                 dict(n_heads=4, norm="post", positional="learned", layers=3)]


@pytest.mark.parametrize("fields", SPEC_VARIANTS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()) or "default")
@torch.no_grad()
def test_cached_steps_equal_the_full_sequence_decoder(fields):
    spec = tf_spec(**fields)
    model = model_for(spec)
    source, lengths = padded([[4, 5, 6, 7, 8], [9, 4], [5, 6, 7]])
    target_in = torch.tensor([[BOS_ID, 4, 5, 6, 7], [BOS_ID, 7, 8, 9, 10], [BOS_ID, 9, 11, 12, 4]])
    full = model(source, lengths, target_in)
    steps, state = stepped(model, source, lengths, target_in)
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=0)
    assert state["past_keys"].shape == (spec.layers, 3, spec.n_heads, 5, spec.head_dim)
    assert state["positions"].tolist() == [5, 5, 5]


@PROPERTY
@given(heads=st.sampled_from([1, 2, 4]), layers=st.integers(1, 2), norm=st.sampled_from(["pre", "post"]),
       rows=st.lists(st.lists(st.integers(4, VOCAB - 1), min_size=1, max_size=6), min_size=1, max_size=4),
       steps=st.integers(1, 6), seed=st.integers(0, 2**16))
@torch.no_grad()
def test_property_step_equals_full_sequence(heads, layers, norm, rows, steps, seed):
    model = model_for(tf_spec(n_heads=heads, layers=layers, norm=norm), seed)
    source, lengths = padded(rows)
    gen = torch.Generator().manual_seed(seed)
    target_in = torch.randint(4, VOCAB, (len(rows), steps), generator=gen)
    target_in[:, 0] = BOS_ID
    torch.testing.assert_close(stepped(model, source, lengths, target_in)[0], model(source, lengths, target_in),
                               atol=ATOL, rtol=PROPERTY_RTOL)


@torch.no_grad()
def test_causal_mask_later_tokens_do_not_change_earlier_positions():
    model = model_for(tf_spec())
    source, lengths = padded([[4, 5, 6], [7, 8, 9]])
    a = torch.tensor([[BOS_ID, 4, 5, 6, 7], [BOS_ID, 8, 9, 10, 11]])
    b = a.clone()
    b[:, 3:] = torch.tensor([[12, 12], [4, 4]])
    torch.testing.assert_close(model(source, lengths, a)[:, :3], model(source, lengths, b)[:, :3], atol=ATOL, rtol=0)
    assert not torch.allclose(model(source, lengths, a)[:, 3:], model(source, lengths, b)[:, 3:], atol=1e-3)


@torch.no_grad()
def test_source_padding_changes_nothing():
    model = model_for(tf_spec())
    target_in = torch.tensor([[BOS_ID, 4, 5]])
    alone = model(*padded([[4, 5, 6]]), target_in)
    source, lengths = padded([[4, 5, 6], [7, 8, 9, 10, 11, 12]])
    batched = model(source, lengths, target_in.expand(2, -1))
    torch.testing.assert_close(batched[:1], alone, atol=ATOL, rtol=0)
    state = model.encode(source, lengths)
    _, _, alphas = model.step(torch.full((2,), BOS_ID), state)
    assert alphas.shape == (2, 6) and float(alphas[0, 3:].abs().max()) == 0.0  # padding gets no weight
    torch.testing.assert_close(alphas.sum(-1), torch.ones(2))


def test_attention_is_the_seeds_scaled_dot_product_with_masked_positions_at_minus_inf():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=gen)  # (N, h, Lq, d)
    k, v = (torch.randn(2, 3, 8, 8, generator=gen) for _ in range(2))  # (N, h, Lk, d)
    mask = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    mask[1, ..., 5:] = False
    want = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf")), -1)
    out, weights = scaled_dot_product(q, k, v, mask, dropout=0.0, need_weights=True)
    torch.testing.assert_close(weights, want)
    torch.testing.assert_close(out, want @ v)
    fused, none = scaled_dot_product(q, k, v, mask, dropout=0.0, need_weights=False)  # training's fused kernel
    assert none is None
    torch.testing.assert_close(fused, out, atol=1e-6, rtol=0)


def test_seed_signatures_and_sinusoids():
    attention = MultiHeadAttention(4, 32)  # seed 002: MultiHeadAttention(heads, input_embed_size)
    assert (attention.heads, attention.head_dim) == (4, 8)
    table = PositionalEncoding(50, 6, "sinusoidal").table
    pos, i = 7, 1  # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)
    assert math.isclose(float(table[pos, 2 * i]), math.sin(pos / 10000 ** (2 * i / 6)), abs_tol=1e-6)
    assert math.isclose(float(table[pos, 2 * i + 1]), math.cos(pos / 10000 ** (2 * i / 6)), abs_tol=1e-6)
    assert PositionalEncoding(50, 6, "learned").learned.weight.shape == (50, 6)


def test_pad_and_bos_are_never_output_and_the_model_learns():
    spec = tf_spec(d_model=32, d_ff=64, n_heads=4)
    torch.manual_seed(0)
    model = build_token_model(spec)
    assert isinstance(model, TransformerSeq2Seq)
    source, lengths = padded([[4, 5, 6], [7, 8], [9, 10, 11, 12]])
    target_in = torch.tensor([[BOS_ID, 6, 5, 4], [BOS_ID, 8, 7, PAD_ID], [BOS_ID, 12, 11, 10]])
    target_out = torch.tensor([[6, 5, 4, EOS_ID], [8, 7, EOS_ID, PAD_ID], [12, 11, 10, EOS_ID]])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = sequence_loss(model(source, lengths, target_in), target_out)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    model.eval()
    assert model.greedy(source, lengths, 6) == [[6, 5, 4], [8, 7], [12, 11, 10]]
    with torch.no_grad():
        log_probs = model(source, lengths, target_in)
    assert float(log_probs[..., [PAD_ID, BOS_ID]].exp().max()) == 0.0


def test_dropout_is_active_in_training_only():
    model = model_for(tf_spec(dropout=0.5))
    source, lengths = padded([[4, 5, 6]])
    target_in = torch.tensor([[BOS_ID, 4]])
    with torch.no_grad():
        torch.testing.assert_close(model(source, lengths, target_in), model(source, lengths, target_in))
        model.train()
        assert not torch.allclose(model(source, lengths, target_in), model(source, lengths, target_in))


@pytest.mark.parametrize(("fields", "message"), [
    (dict(d_model=15), "'d_model' (15) must be a multiple of 'n_heads' (2)"),
    (dict(d_ff=0), "'d_ff' must be an int >= 1"),
    (dict(cell="lstm"), "do not fit a transformer"),
    (dict(bidirectional=True), "do not fit a transformer"),
    (dict(hidden_dim=8), "do not fit a transformer"),
    (dict(attention="additive"), "do not fit a transformer"),
    (dict(dropout=1.0), "'dropout' must be a number in [0, 1)"),
    (dict(dropout=float("nan")), "'dropout' must be a number in [0, 1)"),
    (dict(norm="middle"), "'norm' must be one of ('pre', 'post')"),
    (dict(positional="rotary"), "'positional' must be one of ('sinusoidal', 'learned')"),
    (dict(arch="mamba"), "'arch' must be one of ('recurrent', 'transformer', 'declared')"),
    (dict(kind="points", source_vocab_size=0, target_vocab_size=0), "needs kind 'tokens'"),
])
def test_spec_refuses_bad_transformer_fields(fields, message):
    with pytest.raises(SpecError) as info:
        tf_spec(**fields)
    assert message in str(info.value)


def test_spec_fills_d_model_and_round_trips():
    spec = tf_spec()
    assert (spec.hidden_dim, spec.embedding_dim, spec.attention, spec.max_positions) == (16, 16, "multihead",
                                                                                        DEFAULT_MAX_POSITIONS)
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(SpecError, match="are for transformers"):
        ModelSpec(kind="tokens", embedding_dim=4, source_vocab_size=VOCAB, target_vocab_size=VOCAB, d_ff=8)
    recurrent = ModelSpec(kind="tokens", embedding_dim=4, source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    assert "arch" not in recurrent.to_dict() and "d_model" not in recurrent.to_dict()  # old readers see no change


def test_verify_names_each_differing_field_with_its_value_defaults_included():
    """Two models of one architecture: every field that differs, with its value (defaults shown, not None). Two
    architectures: those alone, as every field of the other's kind differs only by its default (d_ff 0 ...)."""
    from pathlib import Path
    from types import SimpleNamespace

    from export.verify import VerifyError, check_pair

    recurrent = ModelSpec(kind="tokens", embedding_dim=4, source_vocab_size=VOCAB, target_vocab_size=VOCAB)
    with pytest.raises(VerifyError) as info:
        check_pair(Path("ckpt"), Path("model"), recurrent, SimpleNamespace(spec=tf_spec()))
    assert "hold different models (arch: 'recurrent' vs 'transformer');" in str(info.value)
    with pytest.raises(VerifyError) as info:
        check_pair(Path("ckpt"), Path("model"), tf_spec(d_ff=32), SimpleNamespace(spec=tf_spec(max_positions=64)))
    message = str(info.value)
    assert "d_ff: 32 vs 24" in message and "max_positions: 1024 vs 64" in message
    assert "None" not in message  # fields left out of the saved form are shown at their defaults
