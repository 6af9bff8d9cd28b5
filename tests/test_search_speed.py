"""The fast strategies (issue 22: constant state expanded once, array bookkeeping, parent pointers) against the frozen
pre-issue-22 ones in support/search_reference.py: same tokens, scores, log-probs and attention, bit for bit, on
random step functions with ties, dead beams, early and late eos; and the same batch sizes stepped."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.errors import InputError
from runtime.model import Seq2Seq
from runtime.search import StepResult, beam_search, greedy_search, sample
from runtime.tokens import encode_sources
from runtime.vocab import BOS, EOS

import support.search_reference as old

SHIPPED_TOKENS = Path(__file__).resolve().parents[1] / "artifacts" / "dates"


class Toy:
    """Log-probs and attention from a hash of each row's whole history and its constant encoder memory (batch axis
    1) and mask; `grid` > 0 rounds logits to multiples of 1/grid, so many candidates tie exactly."""

    H, LS, D, HEADS = 257, 3, 2, 2

    def __init__(self, seed: int, batch: int, vocab: int, eos_id: int, eos_bias: float, grid: int) -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.normal(size=(self.H, vocab)) * 2
        self.w[:, eos_id] += eos_bias
        if grid:
            self.w = np.round(self.w * grid) / grid
        self.p = rng.integers(-1, 2, size=(self.D, vocab)).astype(np.float64)  # memory's pull on each token
        self.q = rng.normal(size=(self.H, self.HEADS, self.D))
        self.memory = np.round(rng.normal(size=(self.LS, batch, self.D)) * 4).astype(np.float32) / 4  # (Ls, B, D)
        self.mask = np.ones((batch, self.LS), np.float32)
        self.calls: list[int] = []
        self.omit_constant = False  # return only the entries a step changes
        self.per_input = False  # the constant entries come once per input (beam_search(per_input=True))
        self.beam = 1  # rows per input

    def state(self, batch: int) -> tuple[dict, dict]:
        state = {"hash": np.zeros(batch, np.int64), "memory": self.memory, "mask": self.mask}
        return state, {"hash": 0, "memory": 1, "mask": 0}

    def step(self, tokens: np.ndarray, state: dict) -> StepResult:
        self.calls.append(len(tokens))
        mem, mask = state["memory"], state["mask"]  # (Ls, N, D), (N, Ls)
        if self.per_input:  # beam_search(per_input=True): one copy per input, its k rows next to each other
            k = len(tokens) // mem.shape[1]
            assert k == self.beam and k * mem.shape[1] == len(tokens)
            mem, mask = np.repeat(mem, k, axis=1), np.repeat(mask, k, axis=0)
        assert mem.shape[1] == len(tokens) and mask.shape == (len(tokens), self.LS)
        h = (state["hash"] * 31 + tokens + 1) % self.H  # (N,)
        logits = self.w[h] + mem.sum(axis=0) @ self.p  # (N, V): quarters plus quarters, so ties stay exact
        log_probs = (logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))).astype(np.float32)
        scores = np.einsum("nhd,lnd->nhl", self.q[h], mem)  # (N, heads, Ls)
        attention = np.exp(scores) / np.exp(scores).sum(axis=2, keepdims=True)
        fed = {"hash": h} if self.omit_constant else {**state, "hash": h}
        return StepResult(log_probs, fed, attention.astype(np.float32))


def assert_same(new: list, ref: list) -> None:
    """Hypotheses equal exactly: tokens, score and log_prob (their float64 bits), attention values, shape, dtype."""
    assert len(new) == len(ref)
    for a, b in zip(new, ref, strict=True):
        assert a.tokens == b.tokens
        assert np.array([a.score, a.log_prob]).tobytes() == np.array([b.score, b.log_prob]).tobytes()
        assert (a.attention is None) == (b.attention is None)
        if a.attention is not None:
            assert a.attention.dtype == b.attention.dtype and a.attention.shape == b.attention.shape
            np.testing.assert_array_equal(a.attention, b.attention)


def nested(hyps: list) -> list[list]:
    """n-best lists as they are; one hypothesis per input (greedy, sampling) as lists of one."""
    return hyps if isinstance(hyps[0], list) else [[h] for h in hyps]


def run_both(fast, slow, params: dict, batch: int, kw: dict) -> None:
    """Run the reference, then the fast strategy without and with the constant entries named (the step then
    returning only what it changes), and beam search with them held once per input too, each on a fresh toy model;
    compare hypotheses and the batch sizes stepped."""
    ref_model = Toy(batch=batch, **params)
    state, axes = ref_model.state(batch)
    ref = nested(slow(ref_model.step, state, axes, batch, 0, params["eos_id"], **kw))
    constant = frozenset({"memory", "mask"})
    variants = [(frozenset(), {}), (constant, {})] + ([(constant, {"per_input": True})] if fast is beam_search else [])
    for constant, extra in variants:
        model = Toy(batch=batch, **params)
        model.omit_constant = bool(constant)
        model.per_input, model.beam = bool(extra), kw.get("beam_size", 1)
        state, axes = model.state(batch)
        out = nested(fast(model.step, state, axes, batch, 0, params["eos_id"], constant=constant, **kw, **extra))
        assert [len(n) for n in out] == [len(n) for n in ref]
        assert_same([h for n in out for h in n], [h for n in ref for h in n])
        assert model.calls == ref_model.calls  # the same rows stepped: finished inputs leave at the same step


models = st.fixed_dictionaries({
    "seed": st.integers(0, 2**31), "vocab": st.integers(2, 9), "eos_bias": st.sampled_from([-2.0, 0.0, 1.0, 3.0]),
    "grid": st.sampled_from([0, 1, 2]),
}).flatmap(lambda p: st.fixed_dictionaries({**{k: st.just(v) for k, v in p.items()},
                                            "eos_id": st.integers(0, p["vocab"] - 1)}))
lengths = st.integers(1, 7).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n)))
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(params=models, batch=st.integers(1, 5), beam=st.integers(1, 6), data=st.data(),
       lp=st.sampled_from([0.0, 1.0, 2.0, -0.5, 0.7, 50.0, -50.0]), length=lengths, attention=st.booleans())
def test_beam_equals_the_reference(params, batch, beam, data, lp, length, attention):
    kw = dict(beam_size=beam, num_hypotheses=data.draw(st.integers(1, beam)), length_penalty=lp,
              max_decoding_length=length[0], min_decoding_length=length[1], return_attention=attention)
    run_both(beam_search, old.beam_search, params, batch, kw)


@PROPERTY
@given(params=models, batch=st.integers(1, 6), length=lengths, attention=st.booleans(), seed=st.integers(0, 99),
       sampling=st.booleans())
def test_greedy_and_sampling_equal_the_reference(params, batch, length, attention, seed, sampling):
    kw = dict(max_decoding_length=length[0], min_decoding_length=length[1], return_attention=attention)
    if sampling:
        kw.update(seed=seed, sampling_temperature=1.5, sampling_topk=3)
        run_both(sample, old.sample, params, batch, kw)
    else:
        run_both(greedy_search, old.greedy_search, params, batch, kw)


@pytest.mark.parametrize("beam, n_best, lp", [(5, 1, 1.0), (5, 5, 0.0), (3, 2, 2.0), (8, 8, 1.0), (20, 4, 0.5)])
def test_wide_batches_with_ties_equal_the_reference(beam, n_best, lp):
    # Many inputs finishing at different steps, with coarse logits (ties at every rank) and a larger vocabulary.
    params = dict(seed=beam, vocab=30, eos_id=2, eos_bias=1.5, grid=1)
    kw = dict(beam_size=beam, num_hypotheses=n_best, length_penalty=lp, max_decoding_length=12, return_attention=True)
    run_both(beam_search, old.beam_search, params, 40, kw)


TEXTS = {"shipped_gru": ["12 march 1999", "tuesday, 3 august 2021", "1/2/03", "jan 5, 1987"],
         "transformer": ["one is one", "two is two", "three is three"], "recurrent": ["one is one", "two is two"]}
CONSTANT = {"shipped_gru": {"keys", "memory", "source_mask"}, "recurrent": {"keys", "memory", "source_mask"},
            "transformer": {"cross_keys", "cross_values", "source_mask"}}


@pytest.mark.parametrize("which", list(TEXTS))
@pytest.mark.parametrize("beam, n_best, lp", [(4, 3, 0.6), (5, 1, 1.0)])
def test_token_models_decode_as_before(which, beam, n_best, lp, request):
    path = SHIPPED_TOKENS if which == "shipped_gru" else request.getfixturevalue(f"{which}_export").path
    model = Seq2Seq.load(path, provider="cpu")
    steps, texts = model.token_steps, TEXTS[which]
    assert steps.constant == CONSTANT[which]  # the step inputs that no step output feeds back
    length = min(model.spec.target_len, model.spec.max_positions) if model.spec.is_transformer else 20
    kw = dict(beam_size=beam, num_hypotheses=n_best, length_penalty=lp, max_decoding_length=length,
              return_attention=True)
    state = steps.encode(*encode_sources(texts, model.vocabularies["source"], model.spec))
    new = beam_search(steps.step, state, steps.batch_axes, len(texts), BOS, EOS, constant=steps.constant, **kw)
    ref = old.beam_search(steps.step, state, steps.batch_axes, len(texts), BOS, EOS, **kw)
    assert_same([h for n in new for h in n], [h for n in ref for h in n])
    translated = model.translate_batch(texts, **kw)  # translate passes the constant set through, and runs a
    # recurrent export's beam step, whose attention reads its input's one copy of the memory: the same ids
    folded = steps.has_beam_step
    ours = beam_search(steps.beam_step if folded else steps.step, state, steps.batch_axes, len(texts), BOS, EOS,
                       constant=steps.constant, per_input=folded, **kw)
    assert [[t.ids for t in n] for n in translated] == [[h.tokens for h in n] for n in ours]
    assert [[t.score for t in n] for n in translated] == [[h.score for h in n] for n in ours]
    assert [[h.tokens for h in n] for n in ours] == [[h.tokens for h in n] for n in new]
    np.testing.assert_allclose([h.score for n in ours for h in n], [h.score for n in new for h in n], rtol=1e-5)


@pytest.mark.parametrize("constant, message", [("memory", "set of state entry names"), ({"nope"}, "nope")])
def test_constant_must_name_state_entries(constant, message):
    model = Toy(0, 2, 5, 1, 0.0, 0)
    state, axes = model.state(2)
    for search in (beam_search, greedy_search):
        with pytest.raises(InputError, match=message):
            search(model.step, state, axes, 2, 0, 1, max_decoding_length=3, constant=constant)
