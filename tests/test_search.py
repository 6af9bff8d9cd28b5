"""Decoding strategies against toy numpy step functions: hand rollouts, brute force, batching, filters, errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from runtime.errors import InputError
from runtime.search import (
    StepResult,
    apply_temperature,
    beam_search,
    filter_logits,
    greedy_search,
    sample,
    select,
    top_k_filter,
    top_p_filter,
)

V, BOS, EOS = 5, 0, 1
SCORE_RTOL = 1e-12  # scores are float64 sums of the same float32 log-probs, in the same order
FREQ_ATOL = 0.02  # sampled frequencies over 20000 draws: about 6 standard errors


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return (x - np.log(np.exp(x).sum(axis=-1, keepdims=True))).astype(np.float32)


class Markov:
    """Log-probs depend only on the previous token; the state is a dummy per-row array."""

    def __init__(self, seed: int, eos_bias: float = 0.0):
        logits = np.random.default_rng(seed).normal(size=(V, V)) * 2
        logits[:, EOS] += eos_bias
        self.table = log_softmax(logits)  # (V, V): row = previous token

    def log_probs(self, history: tuple[int, ...], b: int) -> np.ndarray:
        return self.table[history[-1]]

    def step(self, tokens: np.ndarray, state: dict) -> StepResult:
        assert tokens.dtype == np.int64 and state["dummy"].shape == (len(tokens), 3)
        return StepResult(self.table[tokens], {"dummy": state["dummy"] + 1})

    def state(self, batch: int) -> tuple[dict, dict]:
        return {"dummy": np.zeros((batch, 3), np.float32)}, {"dummy": 0}


class History:
    """Log-probs and attention depend on the whole token history and on the row's encoder memory (batch axis 1)."""

    H, LS, D, HEADS = 1009, 4, 3, 2

    def __init__(self, seed: int, batch: int, eos_bias: float = 0.0):
        rng = np.random.default_rng(seed)
        self.w = rng.normal(size=(self.H, V)) * 2
        self.w[:, EOS] += eos_bias
        self.p = rng.normal(size=(self.D, V))
        self.q = rng.normal(size=(self.H, self.HEADS, self.D))
        self.memory = rng.normal(size=(self.LS, batch, self.D)).astype(np.float32)  # (Ls, B, D)
        self.calls: list[int] = []  # batch size of every step call

    def _hash(self, history: tuple[int, ...]) -> int:
        h = 0
        for token in history:
            h = (h * 31 + token + 1) % self.H
        return h

    def log_probs(self, history: tuple[int, ...], b: int) -> np.ndarray:
        return self._lp(history, self.memory[:, b])

    def attention(self, history: tuple[int, ...], b: int) -> np.ndarray:
        return self._att(history, self.memory[:, b])

    def _lp(self, history, mem):
        return log_softmax(self.w[self._hash(history)] + mem.mean(0) @ self.p)

    def _att(self, history, mem):
        scores = self.q[self._hash(history)] @ mem.T  # (heads, Ls)
        return np.exp(log_softmax(scores))

    def step(self, tokens: np.ndarray, state: dict) -> StepResult:
        self.calls.append(len(tokens))
        history = np.concatenate([state["history"], tokens[:, None]], axis=1)  # (B, t + 1)
        mem = state["memory"]  # (Ls, B, D)
        rows = [tuple(int(t) for t in h) for h in history]
        log_probs = np.stack([self._lp(h, mem[:, i]) for i, h in enumerate(rows)])
        attention = np.stack([self._att(h, mem[:, i]) for i, h in enumerate(rows)])  # (B, heads, Ls)
        return StepResult(log_probs, {"history": history, "memory": mem}, attention)

    def state(self, inputs: list[int] | None = None) -> tuple[dict, dict]:
        memory = self.memory if inputs is None else self.memory[:, inputs]
        return {"history": np.zeros((memory.shape[1], 0), np.int64), "memory": memory}, {"history": 0, "memory": 1}


def hand_greedy(model, b: int, max_len: int, min_len: int = 0) -> tuple[list[int], float]:
    """Argmax rollout of input b, one token at a time, from the model's own log-probs."""
    tokens, total = [], 0.0
    for t in range(max_len):
        lp = model.log_probs((BOS, *tokens), b).astype(np.float64)
        if t < min_len:
            lp[EOS] = -np.inf
        tok = int(np.argmax(lp))
        total += lp[tok]
        if tok == EOS:
            break
        tokens.append(tok)
    return tokens, total


def brute_force(model, b: int, max_len: int, min_len: int, length_penalty: float) -> list[tuple[list[int], float]]:
    """Every sequence of input b, scored log_prob / length ** length_penalty (length counts eos), best first."""
    out = []

    def walk(tokens: list[int], total: float) -> None:
        lp = model.log_probs((BOS, *tokens), b).astype(np.float64)
        n = len(tokens)
        if n >= min_len:
            out.append((tokens, (total + lp[EOS]) / (n + 1) ** length_penalty))
        for tok in range(V):
            if tok != EOS:
                if n + 1 == max_len:
                    out.append((tokens + [tok], (total + lp[tok]) / max_len ** length_penalty))
                else:
                    walk(tokens + [tok], total + lp[tok])

    walk([], 0.0)
    return sorted(out, key=lambda pair: -pair[1])


def run_greedy(model, batch, **kw):
    state, axes = model.state(batch) if isinstance(model, Markov) else model.state()
    return greedy_search(model.step, state, axes, batch, BOS, EOS, **kw)


def run_beam(model, batch, **kw):
    state, axes = model.state(batch) if isinstance(model, Markov) else model.state()
    return beam_search(model.step, state, axes, batch, BOS, EOS, **kw)


def run_sample(model, batch, **kw):
    state, axes = model.state(batch) if isinstance(model, Markov) else model.state()
    return sample(model.step, state, axes, batch, BOS, EOS, **kw)


MODELS = {"markov": lambda: Markov(3), "history": lambda: History(5, batch=3, eos_bias=0.5)}


# ---- step interface -----------------------------------------------------------------------

def test_select_takes_rows_along_each_batch_axis():
    state = {"h": np.arange(6).reshape(3, 2), "m": np.arange(24).reshape(2, 3, 4)}
    out = select(state, np.array([2, 2, 0]), {"h": 0, "m": 1})
    np.testing.assert_array_equal(out["h"], state["h"][[2, 2, 0]])
    np.testing.assert_array_equal(out["m"], state["m"][:, [2, 2, 0]])


def test_search_imports_numpy_only():
    code = "import sys, runtime.search; print(sorted({'torch', 'onnxruntime', 'onnx'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- greedy -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("min_len", [0, 2])
def test_greedy_equals_hand_argmax_rollout(name, min_len):
    model, batch = MODELS[name](), 3
    hyps = run_greedy(model, batch, max_decoding_length=8, min_decoding_length=min_len)
    assert len(hyps) == batch
    for b, hyp in enumerate(hyps):
        tokens, total = hand_greedy(model, b, 8, min_len)
        assert hyp.tokens == tokens
        np.testing.assert_allclose([hyp.log_prob, hyp.score], [total, total], rtol=SCORE_RTOL)


def test_greedy_drops_finished_rows_and_matches_each_input_alone():
    model = History(11, batch=6, eos_bias=1.0)
    together = run_greedy(model, 6, max_decoding_length=10)
    assert len({len(h.tokens) for h in together}) > 1  # rows finish at different steps, so dropping is exercised
    assert model.calls == sorted(model.calls, reverse=True) and model.calls[-1] < 6  # the batch really shrank
    for b in range(6):
        state, axes = model.state([b])
        alone = greedy_search(model.step, state, axes, 1, BOS, EOS, max_decoding_length=10)[0]
        assert alone.tokens == together[b].tokens
        np.testing.assert_allclose(alone.log_prob, together[b].log_prob, rtol=SCORE_RTOL)


# ---- beam ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("min_len", [0, 3])
def test_beam_size_one_equals_greedy(name, min_len):
    model = MODELS[name]()
    greedy = run_greedy(model, 3, max_decoding_length=7, min_decoding_length=min_len)
    beam = run_beam(model, 3, beam_size=1, length_penalty=0.0, max_decoding_length=7, min_decoding_length=min_len)
    for g, (b,) in zip(greedy, beam, strict=True):
        assert b.tokens == g.tokens
        np.testing.assert_allclose(b.log_prob, g.log_prob, rtol=SCORE_RTOL)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0, -0.5])
@pytest.mark.parametrize("min_len", [0, 2])
@pytest.mark.parametrize("n_best", [1, 6])
@pytest.mark.parametrize("seed, eos_bias", [(10, 0.5), (25, 1.5)])
def test_wide_beam_equals_brute_force(length_penalty, min_len, n_best, seed, eos_bias):
    # These seeds also test the stopping rule: with length_penalty > 0 a too-hasty bound on what live beams can
    # still reach stops before the best hypothesis (seed 10 at 2.0, seed 25 at 1.0 with n_best=1).
    model, max_len = History(seed, batch=2, eos_bias=eos_bias), 4
    # A beam as wide as every candidate of the last step (64 live prefixes x V) cannot prune anything.
    hyps = run_beam(model, 2, beam_size=64 * V, num_hypotheses=n_best, length_penalty=length_penalty,
                    max_decoding_length=max_len, min_decoding_length=min_len)
    for b in range(2):
        expected = brute_force(model, b, max_len, min_len, length_penalty)[:n_best]
        assert [h.tokens for h in hyps[b]] == [tokens for tokens, _ in expected]
        np.testing.assert_allclose([h.score for h in hyps[b]], [s for _, s in expected], rtol=SCORE_RTOL)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_n_best_sorted_distinct_and_scored_by_the_formula(length_penalty):
    model, max_len = History(13, batch=3), 6
    hyps = run_beam(model, 3, beam_size=4, num_hypotheses=4, length_penalty=length_penalty,
                    max_decoding_length=max_len)
    for b, n_best in enumerate(hyps):
        assert len(n_best) == 4
        scores = [h.score for h in n_best]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in n_best}) == 4
        for h in n_best:
            assert len(h.tokens) <= max_len and EOS not in h.tokens
            lps = [model.log_probs((BOS, *h.tokens[:i]), b)[tok] for i, tok in enumerate(h.tokens)]
            ended = len(h.tokens) < max_len  # shorter than max length only by producing eos
            if ended:
                lps.append(model.log_probs((BOS, *h.tokens), b)[EOS])
            np.testing.assert_allclose(h.log_prob, sum(float(x) for x in lps), rtol=1e-6)
            np.testing.assert_allclose(h.score, h.log_prob / len(lps) ** length_penalty, rtol=SCORE_RTOL)


def test_beam_returns_fewer_hypotheses_when_fewer_sequences_exist():
    # max length 1 with eos forbidden leaves V - 1 one-token sequences; dead beams and masked eos are not hypotheses.
    hyps = run_beam(Markov(6), 2, beam_size=8, num_hypotheses=8, max_decoding_length=1, min_decoding_length=1)
    for n_best in hyps:
        assert sorted(h.tokens for h in n_best) == [[t] for t in range(V) if t != EOS]
        assert all(np.isfinite(h.score) for h in n_best)


def test_beam_batch_equals_each_input_alone():
    model = History(17, batch=5, eos_bias=1.0)
    kw = dict(beam_size=3, num_hypotheses=2, length_penalty=0.0, max_decoding_length=9)
    together = run_beam(model, 5, **kw)
    assert len({len(n_best[0].tokens) for n_best in together}) > 1
    assert model.calls[-1] < model.calls[0] and all(c % 3 == 0 for c in model.calls)  # whole inputs dropped
    for b in range(5):
        state, axes = model.state([b])
        alone = beam_search(model.step, state, axes, 1, BOS, EOS, **kw)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[b]]
        np.testing.assert_allclose([h.score for h in alone], [h.score for h in together[b]], rtol=SCORE_RTOL)



def test_beam_expansion_asks_between_before_every_piece_and_stops_when_it_raises(monkeypatch):
    """`between` (a caller's cancel) is called before each piece of each entry expanded to k rows per input, ahead of
    the first step; the hypotheses are those of a search without it, and an exception from it stops the search
    before any step. Without it, a 0.5 GB expansion ran seconds with no cancel asked (a served deadline overran)."""
    import runtime.search.beam as beam

    monkeypatch.setattr(beam, "EXPAND_BYTES", 3 * 4 * 3 * 4)  # memory (Ls, B, D) float32: 3 rows a piece
    model = History(23, batch=4, eos_bias=0.5)
    kw = dict(beam_size=5, num_hypotheses=2, max_decoding_length=6)
    calls: list[int] = []
    with_between = run_beam(model, 4, between=lambda: calls.append(len(model.calls)), **kw)
    model.calls.clear()
    assert [[h.tokens for h in n] for n in with_between] == [[h.tokens for h in n] for n in run_beam(model, 4, **kw)]
    # history (B, 0) is one piece; memory's 20 rows (4 inputs x 5 beams) are 7 pieces of at most 3
    assert calls == [0] * 8

    class Stop(Exception):
        pass

    def stop_at_third() -> None:
        calls.append(0)
        if len(calls) == 3:
            raise Stop()

    calls.clear()
    model.calls.clear()
    with pytest.raises(Stop):
        run_beam(model, 4, between=stop_at_third, **kw)
    assert model.calls == []  # no step ran


# ---- lengths, for every strategy -----------------------------------------------------------

STRATEGIES = {
    "greedy": lambda m, b, **kw: run_greedy(m, b, **kw),
    "beam": lambda m, b, **kw: [n[0] for n in run_beam(m, b, beam_size=3, **kw)],
    "sample": lambda m, b, **kw: run_sample(m, b, seed=0, **kw),
}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_min_decoding_length_prevents_early_eos(strategy):
    model = Markov(1, eos_bias=8.0)  # eos is by far the likeliest token everywhere
    assert all(h.tokens == [] for h in STRATEGIES[strategy](model, 4, max_decoding_length=6))
    hyps = STRATEGIES[strategy](model, 4, max_decoding_length=6, min_decoding_length=3)
    assert all(len(h.tokens) == 3 for h in hyps)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_max_decoding_length_is_respected(strategy):
    model = Markov(2, eos_bias=-30.0)  # eos practically never wins
    hyps = STRATEGIES[strategy](model, 4, max_decoding_length=5)
    assert [len(h.tokens) for h in hyps] == [5] * 4


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_return_attention_aligned_with_tokens(strategy):
    model = History(19, batch=3, eos_bias=0.5)
    hyps = STRATEGIES[strategy](model, 3, max_decoding_length=6, return_attention=True)
    for b, h in enumerate(hyps):
        assert h.attention.shape == (len(h.tokens), History.HEADS, History.LS)
        for i in range(len(h.tokens)):  # the attention that produced token i saw bos + tokens[:i]
            np.testing.assert_allclose(h.attention[i], model.attention((BOS, *h.tokens[:i]), b), rtol=1e-6)
    assert all(h.attention is None for h in STRATEGIES[strategy](model, 3, max_decoding_length=6))


# ---- sampling -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("filters", [dict(sampling_topk=1), dict(sampling_topp=1e-6),
                                     dict(sampling_topk=1, sampling_temperature=3.0)])
def test_sampling_that_keeps_one_token_equals_greedy(name, filters):
    model = MODELS[name]()
    greedy = run_greedy(model, 3, max_decoding_length=8, min_decoding_length=2)
    sampled = run_sample(model, 3, max_decoding_length=8, min_decoding_length=2, seed=123, **filters)
    assert [h.tokens for h in sampled] == [h.tokens for h in greedy]
    np.testing.assert_allclose([h.log_prob for h in sampled], [h.log_prob for h in greedy], rtol=SCORE_RTOL)


@pytest.mark.parametrize("name", MODELS)
def test_a_vanishing_temperature_samples_the_greedy_tokens(name, recwarn):
    """T -> 0 is argmax. Log-probs / T overflowed to -inf in every column where the best log-prob was under
    -1.8e308 T (-4 at the smallest normal T: an unsure step over a vocabulary of a few hundred), and the draw then
    took column 0."""
    unsure = np.log(np.full((2, 400), 1 / 400))  # (B, V): every log-prob -5.99
    unsure[:, 7] += 1e-3  # one best token, still under -4
    out = filter_logits(unsure, temperature=2.3e-308)
    assert (np.argmax(out, axis=1) == 7).all() and np.isfinite(out[:, 7]).all()
    model = MODELS[name]()
    greedy = run_greedy(model, 3, max_decoding_length=8, min_decoding_length=2)
    sampled = run_sample(model, 3, max_decoding_length=8, min_decoding_length=2, seed=3, sampling_temperature=1e-300)
    assert [h.tokens for h in sampled] == [h.tokens for h in greedy]
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]  # no overflow warning either


def test_a_huge_temperature_never_draws_a_never_output_id():
    """T -> inf is uniform, but over the tokens the model can output: `never` ids stay at -inf (a step that puts
    them at a finite floor, -1e4 / 1e30 ~ 0, drew them)."""
    model = Markov(4)
    model.table[:, 3] = -1e4  # a never-output id at seq2onnx's floor, not -inf
    hyps = run_sample(model, 2000, max_decoding_length=3, seed=1, sampling_temperature=1e30, never=(3,))
    assert not any(3 in h.tokens for h in hyps)
    drawn = np.bincount([t for h in hyps for t in h.tokens], minlength=V)
    assert drawn[[2, 4]].min() > 0 and drawn[BOS] > 0  # the others are all drawn (BOS is an ordinary id here)
    plain = run_sample(model, 2000, max_decoding_length=3, seed=1, sampling_temperature=1e30)
    assert any(3 in h.tokens for h in plain)  # without `never` the floor is no floor at that temperature


def test_sampling_is_reproducible_with_a_seed():
    model = History(23, batch=3)
    kw = dict(max_decoding_length=8, sampling_temperature=1.5)
    first = run_sample(model, 3, seed=42, **kw)
    assert [h.tokens for h in run_sample(model, 3, seed=42, **kw)] == [h.tokens for h in first]
    others = [[h.tokens for h in run_sample(model, 3, seed=s, **kw)] for s in range(5)]
    assert any(o != [h.tokens for h in first] for o in others)  # the seed really drives the draws


@pytest.mark.parametrize("kw, transform", [
    (dict(), lambda lp: lp),
    (dict(sampling_temperature=2.0), lambda lp: lp / 2.0),
    (dict(sampling_topk=2), lambda lp: np.where(lp >= np.sort(lp)[-2], lp, -np.inf)),
])
def test_sampling_draws_from_the_filtered_distribution(kw, transform):
    model, n = Markov(4), 20000
    hyps = run_sample(model, n, max_decoding_length=1, seed=7, **kw)
    first = np.array([h.tokens[0] if h.tokens else EOS for h in hyps])
    expected = np.exp(log_softmax(transform(model.table[BOS].astype(np.float64))))
    np.testing.assert_allclose(np.bincount(first, minlength=V) / n, expected, atol=FREQ_ATOL)


# ---- filters ------------------------------------------------------------------------------

def logits_of(probs) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64))[None]  # (1, V)


@pytest.mark.parametrize("probs, p, kept", [
    ([0.1, 0.5, 0.15, 0.25], 0.7, {1, 3}),  # 0.5 alone is short of 0.7; 0.5 + 0.25 reaches it
    ([0.1, 0.5, 0.15, 0.25], 0.76, {1, 3, 2}),
    ([0.1, 0.5, 0.15, 0.25], 0.3, {1}),
    ([0.2, 0.4, 0.2, 0.2], 0.5, {1, 0}),  # a tie at the boundary: only one of them, the lower id
    ([0.2, 0.4, 0.2, 0.2], 1e-9, {1}),  # always at least one token
    ([0.2, 0.4, 0.2, 0.2], 1.0, {0, 1, 2, 3}),
    ([0.25] * 4, 0.5, {0, 1}),  # exactly p is enough: equal logits make the sums exact
])
def test_top_p_keeps_the_minimal_set(probs, p, kept):
    logits = logits_of(probs)
    out = top_p_filter(logits, p)
    assert set(np.flatnonzero(np.isfinite(out[0]))) == kept
    np.testing.assert_array_equal(out[np.isfinite(out)], logits[np.isfinite(out)])  # kept values untouched


def test_top_k_keeps_exactly_k_ties_to_lower_id():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 3.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    out = top_k_filter(logits, 2)
    assert [set(np.flatnonzero(np.isfinite(row))) for row in out] == [{1, 2}, {0, 1}]
    np.testing.assert_array_equal(top_k_filter(logits, 9), logits)
    assert set(np.flatnonzero(np.isfinite(top_k_filter(np.zeros((1, 300)), 3)[0]))) == {0, 1, 2}


def test_filters_compose_in_the_stated_order():
    logits = logits_of([0.6, 0.3, 0.1])
    kept = lambda out: set(np.flatnonzero(np.isfinite(out[0])))  # noqa: E731
    assert kept(top_p_filter(logits, 0.55)) == {0}
    assert kept(filter_logits(logits, temperature=3.0, topp=0.55)) == {0, 1}  # flattened first: 0 alone is 0.43
    # top-p measures the top-k survivors only: 0 then holds 0.56 of their mass.
    out = filter_logits(logits, temperature=3.0, topk=2, topp=0.55)
    assert kept(out) == {0}
    np.testing.assert_array_equal(out, top_p_filter(top_k_filter(apply_temperature(logits, 3.0), 2), 0.55))
    np.testing.assert_array_equal(filter_logits(logits), logits)  # defaults are off


# ---- invalid arguments --------------------------------------------------------------------

def call_with(strategy: str, **kw):
    model = History(1, batch=2)
    state, axes = model.state()
    args = dict(step=model.step, state=state, batch_axes=axes, batch_size=2, bos_id=BOS, eos_id=EOS,
                max_decoding_length=4)
    args.update(kw)
    return {"greedy": greedy_search, "beam": beam_search, "sample": sample}[strategy](**args)


@pytest.mark.parametrize("strategy, kw, name", [
    ("beam", dict(beam_size=0), "beam_size"),
    ("beam", dict(beam_size=2, num_hypotheses=3), "num_hypotheses"),
    ("beam", dict(num_hypotheses=0), "num_hypotheses"),
    ("beam", dict(length_penalty=float("nan")), "length_penalty"),
    ("beam", dict(length_penalty=2**2000), "length_penalty"),  # an int beyond float64
    ("greedy", dict(max_decoding_length=0), "max_decoding_length"),
    ("greedy", dict(min_decoding_length=5), "min_decoding_length"),
    ("greedy", dict(bos_id=-1), "bos_id"),
    ("greedy", dict(eos_id=1.5), "eos_id"),
    ("greedy", dict(eos_id=V), "eos_id"),  # out of the step's vocabulary
    ("greedy", dict(batch_size=3), "batch_size"),
    ("greedy", dict(batch_axes={"history": 0}), "memory"),
    ("sample", dict(sampling_temperature=0.0), "sampling_temperature"),
    ("sample", dict(sampling_temperature=float("inf")), "sampling_temperature"),
    ("sample", dict(sampling_temperature=-(2**2000)), "sampling_temperature"),
    ("sample", dict(sampling_topk=-1), "sampling_topk"),
    ("sample", dict(sampling_topp=0.0), "sampling_topp"),
    ("sample", dict(sampling_topp=1.5), "sampling_topp"),
    ("sample", dict(sampling_topp=1e-320), "sampling_topp"),  # subnormal: 0 while denormals are flushed
    ("sample", dict(sampling_temperature=5e-324), "sampling_temperature"),
    ("sample", dict(never=(V,)), "never"),
    ("sample", dict(seed="x"), "seed"),
    ("sample", dict(seed=2**64), "seed"),  # past an unsigned 64-bit integer (CTranslate2's sampling seed)
])
def test_invalid_arguments_raise_input_error_naming_them(strategy, kw, name):
    with pytest.raises(InputError) as info:
        call_with(strategy, **kw)
    message = str(info.value)
    assert name in message and "\n" not in message


@pytest.mark.parametrize("call, name, value", [
    (lambda: top_k_filter(np.zeros((1, 3)), 0), "k", "0"),
    (lambda: top_p_filter(np.zeros((1, 3)), 0.0), "p", "0.0"),
    (lambda: apply_temperature(np.zeros((1, 3)), -1.0), "temperature", "-1.0"),
])
def test_invalid_filter_arguments_raise_input_error(call, name, value):
    with pytest.raises(InputError, match=rf"^{name} must .* got {value}$"):
        call()


def test_return_attention_without_step_attention_is_an_input_error():
    model = Markov(0)
    state, axes = model.state(2)
    with pytest.raises(InputError, match="return_attention"):
        greedy_search(model.step, state, axes, 2, BOS, EOS, max_decoding_length=3, return_attention=True)

