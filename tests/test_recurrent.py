"""Recurrent token models: every cell/layers/direction/attention combination, padding, attention math, learning;
and the spec growing by fields with defaults (old spec.json and manifest.json files still load)."""
from __future__ import annotations

import itertools

import pytest
import torch

from runtime.spec import ModelSpec, SpecError
from training.tokens.recurrent import BOS_ID, EOS_ID, PAD_ID, TokenSeq2Seq, sequence_loss

VOCAB, EMBED, HIDDEN = 12, 6, 8
COMBOS = list(itertools.product(("gru", "lstm"), (1, 2), (False, True), ("none", "dot", "additive")))


def token_spec(cell: str = "gru", layers: int = 1, bidirectional: bool = False, attention: str = "dot",
               tie: bool = False, n_heads: int = 1) -> ModelSpec:
    """A tiny token spec."""
    return ModelSpec(kind="tokens", cell=cell, layers=layers, bidirectional=bidirectional, attention=attention,
                     n_heads=n_heads, hidden_dim=HIDDEN, embedding_dim=EMBED, source_vocab_size=VOCAB, target_vocab_size=VOCAB,
                     tie_embeddings=tie)


def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (N, L) and lengths (N,)."""
    length = max(map(len, rows))
    ids = torch.tensor([r + [PAD_ID] * (length - len(r)) for r in rows])
    return ids, torch.tensor([len(r) for r in rows])


def model_for(spec: ModelSpec, seed: int = 0) -> TokenSeq2Seq:
    """A seeded model in eval mode."""
    torch.manual_seed(seed)
    return TokenSeq2Seq(spec).eval()


ROWS = [[4, 5, 6, 7, 8], [9, 4], [5, 6, 7]]
TARGET_IN = torch.tensor([[BOS_ID, 4, 5, 6], [BOS_ID, 7, 8, PAD_ID], [BOS_ID, 9, PAD_ID, PAD_ID]])


@pytest.mark.parametrize(("cell", "layers", "bidirectional", "attention"), COMBOS)
def test_every_combination_decodes_padded_batches_like_single_inputs(cell, layers, bidirectional, attention):
    model = model_for(token_spec(cell, layers, bidirectional, attention))
    ids, lengths = padded(ROWS)
    with torch.no_grad():
        batch = model(ids, lengths, TARGET_IN)  # (N, T, V)
        assert batch.shape == (3, 4, VOCAB)
        torch.testing.assert_close(batch.exp().sum(-1), torch.ones(3, 4))  # log-probs of a distribution
        for i, row in enumerate(ROWS):  # padding changes nothing: same as the input alone
            alone = model(*padded([row]), TARGET_IN[i:i + 1])
            torch.testing.assert_close(batch[i:i + 1], alone, atol=1e-6, rtol=1e-5)
    enc = model.encode(ids, lengths)
    assert enc["hidden"].shape == (layers, 3, HIDDEN)
    assert (enc["cell"] is None) == (cell == "gru")
    assert enc["memory"].shape == (3, 5, HIDDEN * (2 if bidirectional else 1))


def test_attention_ignores_padding_and_additive_matches_its_formula():
    model = model_for(token_spec(attention="additive"))
    attention = model.decoder.attention
    ids, lengths = padded(ROWS)
    enc = model.encode(ids, lengths)
    query = torch.randn(3, HIDDEN)
    context, alphas = attention(query, enc)
    assert torch.all(alphas[~enc["source_mask"]] == 0)
    torch.testing.assert_close(alphas.sum(-1), torch.ones(3))
    keys = enc["memory"] @ attention.key.weight.T + attention.key.bias  # W_k m + b, (N, L, H)
    scores = (torch.tanh(query[:, None, :] @ attention.query.weight.T + keys) @ attention.v.weight.T).squeeze(-1)
    expected = torch.softmax(scores.masked_fill(~enc["source_mask"], float("-inf")), dim=-1)
    torch.testing.assert_close(alphas, expected)
    torch.testing.assert_close(context, (expected[:, :, None] * enc["memory"]).sum(1))


def test_multihead_attention_matches_its_formula_head_by_head():
    model = model_for(token_spec(attention="multihead", n_heads=2))
    attention = model.decoder.attention
    ids, lengths = padded(ROWS)
    enc = model.encode(ids, lengths)
    query = torch.randn(3, HIDDEN)
    context, alphas = attention(query, enc)
    d_k = HIDDEN // 2
    heads, weights = [], []
    for h in range(2):  # each head on its own slice of the projections, scaled by sqrt(d_k)
        part = slice(h * d_k, (h + 1) * d_k)
        q = (query @ attention.query.weight.T + attention.query.bias)[:, part]  # (N, d_k)
        k = (enc["memory"] @ attention.key.weight.T + attention.key.bias)[:, :, part]  # (N, L, d_k)
        v = (enc["memory"] @ attention.value.weight.T + attention.value.bias)[:, :, part]  # (N, L, d_k)
        scores = (k @ q[:, :, None]).squeeze(-1) / d_k ** 0.5  # (N, L)
        a = torch.softmax(scores.masked_fill(~enc["source_mask"], float("-inf")), dim=-1)
        heads.append((a[:, :, None] * v).sum(1))
        weights.append(a)
    torch.testing.assert_close(context, torch.cat(heads, -1) @ attention.out.weight.T + attention.out.bias)
    torch.testing.assert_close(alphas, torch.stack(weights).mean(0))
    assert torch.all(alphas[~enc["source_mask"]] == 0)


def test_tied_embeddings_share_the_target_embedding():
    model = model_for(token_spec(tie=True))
    assert not hasattr(model.decoder, "output")
    ids, lengths = padded(ROWS)
    loss = sequence_loss(model(ids, lengths, TARGET_IN), TARGET_IN.roll(-1, dims=1))
    loss.backward()
    assert model.decoder.embedding.weight.grad is not None and model.decoder.embedding.weight.grad.abs().sum() > 0


def test_loss_ignores_padding():
    log_probs = torch.log_softmax(torch.randn(2, 3, VOCAB), dim=-1)
    target = torch.tensor([[4, 5, PAD_ID], [6, PAD_ID, PAD_ID]])
    by_hand = -(log_probs[0, 0, 4] + log_probs[0, 1, 5] + log_probs[1, 0, 6]) / 3
    torch.testing.assert_close(sequence_loss(log_probs, target), by_hand)


@pytest.mark.slow  # trains to an accuracy target
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_learns_to_reverse_short_digit_strings(cell):
    """A few hundred Adam steps on a copy-reversed task: greedy decoding gets most sequences exactly right."""
    torch.manual_seed(0)
    model = TokenSeq2Seq(ModelSpec(kind="tokens", cell=cell, bidirectional=True, attention="dot", hidden_dim=32,
                                   embedding_dim=16, source_vocab_size=VOCAB, target_vocab_size=VOCAB))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)

    def batch(n: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [torch.randint(4, VOCAB, (int(k),), generator=generator).tolist()
                for k in torch.randint(2, 6, (n,), generator=generator)]
        targets = [list(reversed(r)) + [EOS_ID] for r in rows]
        ids, lengths = padded(rows)
        target_in, _ = padded([[BOS_ID] + t[:-1] for t in targets])
        target_out, _ = padded(targets)
        return rows, ids, lengths, target_in, target_out

    first = None
    for _ in range(300):
        _, ids, lengths, target_in, target_out = batch(32)
        loss = sequence_loss(model.train()(ids, lengths, target_in), target_out)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        first = first if first is not None else loss.item()
    rows, ids, lengths, _, _ = batch(200)
    decoded = model.eval().greedy(ids, lengths, max_len=8)
    exact = sum(d == list(reversed(r)) for d, r in zip(decoded, rows)) / len(rows)
    assert loss.item() < first / 4 and exact >= 0.8, (first, loss.item(), exact)


def test_spec_grows_by_fields_with_defaults():
    old = {"n_features": 2, "hidden_dim": 2, "attention": "dot", "n_heads": 1, "cell": "gru", "input_len": 2,
           "target_len": 2}  # a spec.json / manifest spec written before token models existed
    assert ModelSpec.from_dict(old) == ModelSpec() and ModelSpec().to_dict() == old
    spec = token_spec("lstm", 2, True, "additive", tie=True)
    assert ModelSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(("fields", "message"), [
    ({"cell": "lstm"}, "are for token models"),
    ({"layers": 2}, "are for token models"),
    ({"attention": "additive"}, "are for token models"),
    ({"kind": "tokens"}, "'embedding_dim' must be an int >= 1"),
    ({"kind": "tokens", "embedding_dim": 4, "source_vocab_size": 4, "target_vocab_size": 9}, "'source_vocab_size'"),
    ({"kind": "tokens", "embedding_dim": 4, "source_vocab_size": 9, "target_vocab_size": 9, "attention": "multihead",
      "n_heads": 3, "hidden_dim": 8}, "must be a multiple of 'n_heads'"),
    ({"reverse_source": True}, "are for token models"),
    ({"kind": "words"}, "'kind' must be one of"),
    ({"bidirectional": 1}, "true or false"),
])
def test_spec_refuses_what_a_kind_cannot_do(fields, message):
    with pytest.raises(SpecError, match=message):
        ModelSpec(**fields)


def test_pad_and_bos_are_never_outputs_even_when_sampling_hot():
    from runtime.contract import state_batch_axes
    from runtime.search import sample
    from training.tokens.recurrent import torch_steps

    model = model_for(token_spec(attention="dot"))
    ids, lengths = padded(ROWS)
    with torch.no_grad():
        log_probs, _, _ = model.decoder.step(torch.full((3,), BOS_ID), (model.encode(ids, lengths)["hidden"], None),
                                             model.encode(ids, lengths))
    assert bool((log_probs[:, [PAD_ID, BOS_ID]] < -1000).all())
    state, step = torch_steps(model, ids.numpy(), lengths.numpy())
    found = sample(step, state, state_batch_axes(model.spec), 3, BOS_ID, EOS_ID, 30, sampling_temperature=50.0,
                   seed=0)
    drawn = {t for h in found for t in h.tokens}
    assert drawn and not drawn & {PAD_ID, BOS_ID}
