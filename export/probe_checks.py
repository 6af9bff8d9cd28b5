"""What a declared model's `encode` and `step` return, checked against its declaration as the probe
(export.adapted) runs them: the state a dict of the declared tensors, each with the batch on its declared axis;
the scores log-probabilities over the target vocabulary; attention, where declared, over the source. Each failure
is an AdapterError naming the tensor and what it is instead (types and shapes, never a tensor's numbers)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from runtime.errors import brief

from .adapter import AdapterError, Seq2SeqAdapter

LOG_PROB_SUM_TOL = 1e-3  # |logsumexp| of a row of declared log-probs beyond this: they are not log-probabilities


def tensor_dict(value: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(value, dict) or not all(isinstance(v, torch.Tensor) for v in value.values()):
        nested = isinstance(value, dict) and any(isinstance(v, (tuple, list, dict)) for v in value.values())
        hint = ("; each entry one tensor: an LSTM's (h, c) pair is two entries, such as 'h' and 'c', each declared "
                "in state={...}" if nested else "")
        raise AdapterError(f"{what} must be a dict of name: torch.Tensor, got {_what(value)}{hint}")
    return value


def _what(value: Any) -> str:
    """What a value is, without printing tensors' numbers: types and shapes."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor {tuple(value.shape)}"
    if isinstance(value, dict):
        return "a dict of " + ", ".join(f"{k!r}: {_what(v)}" for k, v in list(value.items())[:6])
    if isinstance(value, (tuple, list)):
        if _numbers(value):  # scores as nested lists: their numbers said, not printed
            return f"a {type(value).__name__} of {_numbers(value)} numbers (return a torch.Tensor)"
        return f"a {type(value).__name__} of " + ", ".join(_what(v) for v in value[:6])
    if isinstance(value, np.ndarray):
        return f"a numpy.ndarray {value.dtype} {value.shape} (return a torch.Tensor: torch.from_numpy(...))"
    return brief(value)


def _numbers(value: Any) -> int:
    """How many numbers a (nested) list or tuple of numbers holds; 0 if it holds anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 1
    if isinstance(value, (tuple, list)) and value:
        counts = [_numbers(v) for v in value]
        return sum(counts) if all(counts) else 0
    return 0


def check_encoded(adapter: Seq2SeqAdapter, state: dict[str, torch.Tensor], n: int) -> None:
    """Exactly the declared names, each a tensor whose declared batch axis holds the n sources."""
    missing, extra = sorted(set(adapter.state) - set(state)), sorted(set(state) - set(adapter.state))
    if missing or extra:
        raise AdapterError(f"encode returned {sorted(state)}; the declaration names {sorted(adapter.state)} "
                           f"(missing {missing}, undeclared {extra}): declare every state tensor, and only those")
    for name, decl in adapter.state.items():
        shape = tuple(state[name].shape)
        if decl.batch_axis >= len(shape) or shape[decl.batch_axis] != n:
            holds = [axis for axis, size in enumerate(shape) if size == n]
            hint = (f"; the batch is on axis {holds[0]}" if len(holds) == 1 else
                    "; every state tensor holds a value per source: give it a batch axis, shape (N,) for a number"
                    if not shape else "")
            raise AdapterError(f"state {name!r}: batch_axis {decl.batch_axis} does not hold the batch of {n} "
                               f"sources (its shape is {shape}){hint}")
        if decl.grows is not None and decl.grows >= len(shape):
            raise AdapterError(f"state {name!r}: grows={decl.grows} is not an axis of its shape {shape}")


def check_step(adapter: Seq2SeqAdapter, state: dict[str, torch.Tensor], out: Any, n: int,
               width: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """(scores (n, V), the changed state, attention (n, width) or None), each as declared."""
    if not isinstance(out, tuple) or len(out) not in (2, 3):
        raise AdapterError(f"step must return (scores, next_state) or (scores, next_state, attention), got "
                           f"{_what(out)}")
    scores, changed, attention = (*out, None)[:3]
    size = len(adapter.target_vocab)
    if (isinstance(scores, torch.Tensor) and scores.dtype == torch.float32 and scores.dim() == 2
            and scores.shape[0] == n and scores.shape[1] != size):
        raise AdapterError(f"step's scores have {scores.shape[1]} columns ({tuple(scores.shape)}), but the target "
                           f"vocabulary holds {size} tokens: one score per target token (is the vocabulary the one "
                           "the model's output layer was trained with?)")
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (n, size) or scores.dtype != torch.float32:
        got = f"{scores.dtype} {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else _what(scores)
        raise AdapterError(f"step's scores must be a float32 tensor (batch {n}, target vocabulary {size}), got "
                           f"{got}")
    if torch.isnan(scores).any():
        raise AdapterError(f"step's scores hold NaN (for {int(torch.isnan(scores).any(-1).sum())} of {n} rows); a "
                           "model that yields NaN cannot be decoded")
    if adapter.scores == "log_probs":
        signed = torch.logsumexp(scores.double(), dim=-1)  # 0 for a row of log-probabilities
        total = signed.abs()
        if (total > LOG_PROB_SUM_TOL).any():
            row = int(total.argmax())
            sums = scores.double().sum(dim=-1)
            if bool(((scores >= 0) & (scores <= 1)).all()) and bool(((sums - 1).abs() <= LOG_PROB_SUM_TOL).all()):
                # probabilities: declaring them logits would take log_softmax of them and flatten every score
                raise AdapterError("step's scores are declared scores='log_probs', but they are probabilities (each "
                                   "row in [0, 1], summing to 1): return their log (log_softmax of the logits, or "
                                   "torch.log of the probabilities)")
            raise AdapterError(f"step's scores are declared scores='log_probs', but row {row}'s are not "
                               f"log-probabilities (their logsumexp is {float(signed[row]):.3g}, where "
                               "log-probabilities give 0): declare scores='logits' for raw scores, or return "
                               "log_softmax(...)")
    changed = tensor_dict(changed, "step's next state")
    missing = sorted(set(adapter.changing) - set(changed))
    extra = sorted(set(changed) - set(adapter.state))
    if missing or extra:
        raise AdapterError(f"step's next state holds {sorted(changed)}; it must hold every state tensor declared "
                           f"changes=True {adapter.changing} (missing {missing}) and no undeclared one ({extra})")
    for name in sorted(set(changed) - set(adapter.changing)):  # returned, but declared read-only
        if changed[name].shape != state[name].shape or not torch.equal(changed[name], state[name]):
            raise AdapterError(f"step changed {name!r}, which is declared changes=False (read unchanged by every "
                               f"step); declare it State(changes=True), or leave it as it was")
    for name in adapter.changing:
        want = list(state[name].shape)
        grows = adapter.state[name].grows
        if grows is not None:
            want[grows] += 1
        if list(changed[name].shape) != want:
            got = list(changed[name].shape)
            grew = [axis for axis, (g, w) in enumerate(zip(got, want)) if g == w + 1] if len(got) == len(want) else []
            if grows is not None:
                why = f" (axis {grows} grows by one per step)"
            elif len(grew) == 1 and sum(g != w for g, w in zip(got, want)) == 1:
                why = (f"; its axis {grew[0]} grew by one: for a prefix or cache a step lengthens, declare "
                       f"State(batch_axis={adapter.state[name].batch_axis}, grows={grew[0]})")
            else:
                why = ""
            raise AdapterError(f"step output {name!r} has shape {tuple(changed[name].shape)}, but it feeds back as "
                               f"{name!r}, which is {tuple(state[name].shape)}: expected {tuple(want)}{why}")
        if changed[name].dtype != state[name].dtype:
            raise AdapterError(f"step output {name!r} is {changed[name].dtype}, but {name!r} is "
                               f"{state[name].dtype}; a state keeps its dtype")
    if attention is not None and (not isinstance(attention, torch.Tensor) or tuple(attention.shape) != (n, width)
                                  or attention.dtype != torch.float32):
        got = _what(attention)
        raise AdapterError(f"step's attention must be a float32 tensor (batch {n}, source length {width}) or None, "
                           f"got {got}")
    return scores, changed, attention
