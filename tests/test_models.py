"""The book's models: its printed numbers, state_dict compatibility, teacher forcing and output shapes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from runtime.spec import ModelSpec
from training.build import build_model
from training.points.decode import reference_decode
from training.points.models import (
    Attention,
    Decoder,
    DecoderAttn,
    Encoder,
    EncoderDecoder,
    EncoderDecoderAttn,
)

BOOK_ATOL = 5e-5  # the book prints 4 decimals
EXACT_ATOL = 1e-6  # same arithmetic, possibly a different op order


# --- A minimal, independent copy of the book's reference classes (chapter 9), for comparison only. ---

class RefEncoder(nn.Module):
    def __init__(self, n_features, hidden_dim):
        super().__init__()
        self.n_features = n_features
        self.hidden_dim = hidden_dim
        self.hidden = None
        self.basic_rnn = nn.GRU(self.n_features, self.hidden_dim, batch_first=True)

    def forward(self, x):
        rnn_out, self.hidden = self.basic_rnn(x)
        return rnn_out


class RefDecoder(nn.Module):
    def __init__(self, n_features, hidden_dim):
        super().__init__()
        self.n_features = n_features
        self.hidden_dim = hidden_dim
        self.hidden = None
        self.basic_rnn = nn.GRU(self.n_features, self.hidden_dim, batch_first=True)
        self.regression = nn.Linear(self.hidden_dim, self.n_features)

    def init_hidden(self, hidden_seq):
        self.hidden = hidden_seq[:, -1:].permute(1, 0, 2)

    def forward(self, x):
        batch_first_output, self.hidden = self.basic_rnn(x, self.hidden)
        out = self.regression(batch_first_output[:, -1:])
        return out.view(-1, 1, self.n_features)


class RefAttention(nn.Module):
    def __init__(self, hidden_dim, input_dim=None, proj_values=False):
        super().__init__()
        self.d_k = hidden_dim
        self.input_dim = hidden_dim if input_dim is None else input_dim
        self.proj_values = proj_values
        self.linear_query = nn.Linear(self.input_dim, hidden_dim)
        self.linear_key = nn.Linear(self.input_dim, hidden_dim)
        self.linear_value = nn.Linear(self.input_dim, hidden_dim)
        self.alphas = None

    def init_keys(self, keys):
        self.keys = keys
        self.proj_keys = self.linear_key(self.keys)
        self.values = self.linear_value(self.keys) if self.proj_values else self.keys

    def forward(self, query, mask=None):
        proj_query = self.linear_query(query)
        scores = torch.bmm(proj_query, self.proj_keys.permute(0, 2, 1)) / np.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        alphas = F.softmax(scores, dim=-1)
        self.alphas = alphas.detach()
        return torch.bmm(alphas, self.values)


class RefMultiHeadAttention(nn.Module):
    def __init__(self, n_heads, d_model, input_dim=None, proj_values=True):
        super().__init__()
        self.linear_out = nn.Linear(n_heads * d_model, d_model)
        self.attn_heads = nn.ModuleList(
            [RefAttention(d_model, input_dim=input_dim, proj_values=proj_values) for _ in range(n_heads)])

    def init_keys(self, key):
        for attn in self.attn_heads:
            attn.init_keys(key)

    @property
    def alphas(self):
        return torch.stack([attn.alphas for attn in self.attn_heads], dim=0)

    def forward(self, query, mask=None):
        contexts = [attn(query, mask=mask) for attn in self.attn_heads]
        return self.linear_out(torch.cat(contexts, axis=-1))


class RefDecoderAttn(nn.Module):
    def __init__(self, n_features, hidden_dim, n_heads=None):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.n_features = n_features
        self.hidden = None
        self.basic_rnn = nn.GRU(self.n_features, self.hidden_dim, batch_first=True)
        # The book's single-head decoder; the multi-head variant swaps the attention module in place.
        self.attn = RefAttention(hidden_dim) if n_heads is None else RefMultiHeadAttention(n_heads, hidden_dim)
        self.regression = nn.Linear(2 * self.hidden_dim, self.n_features)

    def init_hidden(self, hidden_seq):
        self.attn.init_keys(hidden_seq)
        self.hidden = hidden_seq[:, -1:].permute(1, 0, 2)

    def forward(self, X, mask=None):
        batch_first_output, self.hidden = self.basic_rnn(X, self.hidden)
        query = batch_first_output[:, -1:]
        context = self.attn(query, mask=mask)
        out = self.regression(torch.cat([context, query], axis=-1))
        return out.view(-1, 1, self.n_features)


class RefEncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder, input_len, target_len, teacher_forcing_prob=0.5):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.input_len = input_len
        self.target_len = target_len
        self.teacher_forcing_prob = teacher_forcing_prob

    def forward(self, x):
        source_seq = x[:, :self.input_len, :]
        target_seq = x[:, self.input_len:, :]
        outputs = torch.zeros(x.shape[0], self.target_len, self.encoder.n_features)
        self.decoder.init_hidden(self.encoder(source_seq))
        dec_inputs = source_seq[:, -1:, :]
        for i in range(self.target_len):
            out = self.decoder(dec_inputs)
            outputs[:, i:i + 1, :] = out
            prob = self.teacher_forcing_prob if self.training else 0
            dec_inputs = target_seq[:, i:i + 1, :] if torch.rand(1) <= prob else out
        return outputs


# --- The book's printed numbers. ---

@pytest.fixture
def full_seq() -> torch.Tensor:
    return torch.tensor([[-1, -1], [-1, 1], [1, 1], [1, -1]]).float().view(1, 4, 2)


def assert_book(actual: torch.Tensor, expected: list) -> None:
    np.testing.assert_allclose(actual.detach().numpy(), np.array(expected, dtype=np.float32), atol=BOOK_ATOL)


def test_encoder_final_hidden_matches_book(full_seq: torch.Tensor) -> None:
    torch.manual_seed(21)
    hidden_seq = Encoder(n_features=2, hidden_dim=2)(full_seq[:, :2])
    assert_book(hidden_seq[:, -1:], [[[0.3105, -0.5263]]])
    assert_book(hidden_seq, [[[0.0832, -0.0356], [0.3105, -0.5263]]])


def test_decoder_greedy_and_teacher_forced_steps_match_book(full_seq: torch.Tensor) -> None:
    source, target = full_seq[:, :2], full_seq[:, 2:]
    torch.manual_seed(21)
    hidden_seq = Encoder(n_features=2, hidden_dim=2)(source)
    torch.manual_seed(21)
    decoder = Decoder(n_features=2, hidden_dim=2)
    decoder.init_hidden(hidden_seq)
    first = decoder(source[:, -1:])
    assert_book(decoder.hidden, [[[0.3913, -0.6853]]])
    second = decoder(first)
    assert_book(first, [[[-0.2339, 0.4702]]])
    assert_book(second, [[[-0.0226, 0.4628]]])
    decoder.init_hidden(hidden_seq)
    decoder(source[:, -1:])
    assert_book(decoder(target[:, :1]), [[[0.2265, 0.4529]]])  # teacher forced: the true third corner


def test_encoder_decoder_eval_matches_book(full_seq: torch.Tensor) -> None:
    torch.manual_seed(21)
    encoder = Encoder(n_features=2, hidden_dim=2)
    torch.manual_seed(21)
    decoder = Decoder(n_features=2, hidden_dim=2)
    model = EncoderDecoder(encoder, decoder, input_len=2, target_len=2, teacher_forcing_prob=0.5).eval()
    assert_book(model(full_seq[:, :2]), [[[-0.2339, 0.4702], [-0.0226, 0.4628]]])


def test_decoder_attn_greedy_steps_match_book(full_seq: torch.Tensor) -> None:
    source = full_seq[:, :2]
    torch.manual_seed(21)
    encoder = Encoder(n_features=2, hidden_dim=2)
    decoder_attn = DecoderAttn(n_features=2, hidden_dim=2)
    decoder_attn.init_hidden(encoder(source))
    first = decoder_attn(source[:, -1:])
    second = decoder_attn(first)
    assert_book(first, [[[-0.3555, -0.1220]]])
    assert_book(second, [[[-0.2641, -0.2521]]])
    # The book then wraps the same modules with teacher_forcing_prob=0 and gets the same two points.
    model = EncoderDecoder(encoder, decoder_attn, input_len=2, target_len=2, teacher_forcing_prob=0.0)
    assert_book(model(full_seq), [[[-0.3555, -0.1220], [-0.2641, -0.2521]]])


def test_attention_mask_example_matches_book() -> None:
    keys = torch.tensor([[[-.38, .44], [.85, -.05]]])
    query = torch.tensor([[[-1., 1.]]])
    source_seq = torch.tensor([[[-1., 1.], [0., 0.]]])
    source_mask = (source_seq != 0).all(axis=2).unsqueeze(1)  # (N, 1, L)
    assert source_mask.tolist() == [[[True, False]]]
    torch.manual_seed(11)
    attnh = Attention(2)
    attnh.init_keys(keys)
    attnh(query, mask=source_mask)
    assert_book(attnh.alphas, [[[1., 0.]]])


# --- state_dict compatibility with the reference classes. ---

def build_reference(spec: ModelSpec, teacher_forcing_prob: float) -> RefEncoderDecoder:
    """The reference model, constructed in the book's order."""
    encoder = RefEncoder(spec.n_features, spec.hidden_dim)
    if spec.attention == "none":
        decoder = RefDecoder(spec.n_features, spec.hidden_dim)
    else:
        decoder = RefDecoderAttn(spec.n_features, spec.hidden_dim,
                                 n_heads=spec.n_heads if spec.attention == "multihead" else None)
    return RefEncoderDecoder(encoder, decoder, spec.input_len, spec.target_len, teacher_forcing_prob)


SPECS = [
    ModelSpec(attention="none"),
    ModelSpec(attention="dot"),
    ModelSpec(attention="multihead", n_heads=3),
    ModelSpec(n_features=3, hidden_dim=5, attention="dot", input_len=4, target_len=3),
    ModelSpec(n_features=3, hidden_dim=4, attention="multihead", n_heads=2, input_len=3, target_len=2),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.attention}-h{s.n_heads}-F{s.n_features}")
def test_seeded_construction_matches_reference_state_dict(spec: ModelSpec) -> None:
    torch.manual_seed(23)
    ours = build_model(spec).state_dict()
    torch.manual_seed(23)
    ref = build_reference(spec, 0.5).state_dict()
    assert list(ours) == list(ref)
    for key in ref:
        assert torch.equal(ours[key], ref[key]), key


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.attention}-h{s.n_heads}-F{s.n_features}")
def test_reference_state_dict_loads_strictly_and_gives_same_outputs(spec: ModelSpec) -> None:
    torch.manual_seed(5)
    ref = build_reference(spec, 1.0)
    torch.manual_seed(99)  # different initial weights, so only the load can make them agree
    ours = build_model(spec, teacher_forcing_prob=1.0)
    ours.load_state_dict(ref.state_dict(), strict=True)
    full = torch.randn(4, spec.input_len + spec.target_len, spec.n_features)
    source = full[:, :spec.input_len]
    with torch.no_grad():
        # Training mode with teacher_forcing_prob=1 is deterministic in both.
        np.testing.assert_allclose(ours.train()(full).numpy(), ref.train()(full).numpy(), atol=EXACT_ATOL)
        np.testing.assert_allclose(ours.eval()(source).numpy(), ref.eval()(source).numpy(), atol=EXACT_ATOL)


# --- Teacher forcing semantics. ---

def forward_pair(prob: float, change_step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training-mode outputs for a batch and for the same batch with one target step changed."""
    spec = ModelSpec(attention="dot", input_len=2, target_len=3)
    torch.manual_seed(0)
    model = build_model(spec, teacher_forcing_prob=prob).train()
    full = torch.randn(3, 5, 2)
    changed = full.clone()
    changed[:, spec.input_len + change_step] += 1.0
    with torch.no_grad():
        return model(full), model(changed)


def test_teacher_forcing_one_feeds_the_true_targets() -> None:
    before, after = forward_pair(prob=1.0, change_step=0)
    assert torch.equal(before[:, 0], after[:, 0])  # step 1 is predicted before any target is seen
    assert not torch.allclose(before[:, 1], after[:, 1])  # step 2 was fed the (changed) true step 1
    before, after = forward_pair(prob=1.0, change_step=2)
    assert torch.equal(before, after)  # the last target is never an input


@pytest.mark.parametrize("change_step", [0, 1, 2])
def test_teacher_forcing_zero_never_reads_targets(change_step: int) -> None:
    before, after = forward_pair(prob=0.0, change_step=change_step)
    assert torch.equal(before, after)


def test_eval_mode_ignores_targets_even_with_teacher_forcing_one() -> None:
    torch.manual_seed(0)
    model = build_model(ModelSpec(attention="dot"), teacher_forcing_prob=1.0).eval()
    full = torch.randn(3, 4, 2)
    with torch.no_grad():
        from_full, from_source = model(full), model(full[:, :2])
        greedy, _ = reference_decode(model, full[:, :2], target_len=2)
    assert torch.equal(from_full, from_source)
    np.testing.assert_allclose(from_source.numpy(), greedy.numpy(), atol=EXACT_ATOL)


# --- Shapes. ---

@pytest.mark.parametrize(("attention", "heads"), [("none", 1), ("dot", 1), ("multihead", 3)])
def test_output_and_alpha_shapes(attention: str, heads: int) -> None:
    spec = ModelSpec(n_features=3, hidden_dim=4, attention=attention, n_heads=heads, input_len=5, target_len=2)
    n = 6
    torch.manual_seed(0)
    model = build_model(spec).eval()
    source = torch.randn(n, spec.input_len, spec.n_features)
    with torch.no_grad():
        outputs = model(source)
        ref_outputs, ref_alphas = reference_decode(model, source, spec.target_len)
    assert outputs.shape == ref_outputs.shape == (n, spec.target_len, spec.n_features)
    if attention == "none":
        assert not isinstance(model, EncoderDecoderAttn)
        assert ref_alphas is None
        return
    expected = (n, spec.target_len, spec.input_len) if attention == "dot" else \
        (n, heads, spec.target_len, spec.input_len)
    assert model.alphas.shape == ref_alphas.shape == expected
    np.testing.assert_allclose(model.alphas.sum(-1).numpy(), np.ones(expected[:-1]), atol=EXACT_ATOL)
    np.testing.assert_allclose(model.alphas.numpy(), ref_alphas.numpy(), atol=EXACT_ATOL)
