"""Point models in the runtime: the autoregressive loop (encode once, then step, feed the prediction back, stop), and
the caller's `cancel`, asked between steps by every decoding loop. What callers pass is checked first, in
`runtime.point_inputs`."""
from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

import numpy as np

from .errors import Cancelled, InputError, brief

# A graph runner takes a feed {input name: array} and returns {output name: array}.
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
Cancel = Callable[[], bool]  # asked between decoder steps: True stops the decode
F = TypeVar("F", bound=Callable[..., Any])


def check_cancel(cancel: Any, items: int) -> None:
    """`cancel` is None or something to call with no arguments. A call of `items` > 0 asks it before its first
    decoder step, where `asked` says so of one that takes arguments; a call of none never asks it, so its signature
    is read here (~10 us, which the serving path's every decode would otherwise pay)."""
    if cancel is None:
        return
    if not callable(cancel):
        raise InputError(f"cancel: expected a function of no arguments that returns True to stop the decode, got "
                         f"{brief(cancel)}")
    if items:
        return
    try:
        inspect.signature(cancel).bind()
    except TypeError as exc:
        raise InputError(f"cancel: expected a function of no arguments, got {brief(cancel)} ({exc})") from None
    except ValueError:  # no signature to read (some builtins): its first call says, through `asked`
        pass


def asked(cancel: Cancel) -> bool:
    """cancel()'s answer as a bool; a cancel that cannot be called with no arguments, or answers what has no one
    truth value, is an InputError (its own exceptions pass through)."""
    try:
        answer = cancel()
    except TypeError as exc:
        try:
            inspect.signature(cancel).bind()
        except (TypeError, ValueError):  # it does not take no arguments: the call, not its body, failed
            raise InputError(f"cancel: expected a function of no arguments, got {brief(cancel)} ({exc})") from None
        raise
    try:
        return bool(answer)  # None and the like: go on, as the caller's own `if` would read them
    except (TypeError, ValueError):  # no one truth value: an array of several
        raise InputError(f"cancel: expected True or False from cancel(), got {brief(answer)}") from None


BEFORE = "before it started"  # where a decode stood when the ask before its first graph said stop


def stoppable(step: F, cancel: Cancel, when: str = "between two steps") -> F:
    """`step` that first asks `cancel` and raises Cancelled when it says stop: one check per decoder step, in
    every decoding loop (points, greedy, beam, sampling), without the loops knowing; `when` says where the decode
    stood (a call that starts a decode: "before it started")."""
    def checked(*args: Any) -> Any:
        if asked(cancel):
            raise Cancelled(f"decode: cancelled by its caller {when} (a deadline passed or the client went away)")
        return step(*args)

    return checked  # type: ignore[return-value]


def greedy_decode(
    run_encoder: Runner, run_step: Runner, step_inputs: list[str],
    source: np.ndarray, source_mask: np.ndarray, target_len: int, cancel: Cancel | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode `target_len` points -> outputs (N, Lt, F) and alphas (N, [heads,] Lt, Ls) or None; `cancel` is
    asked before the encoder and before every step (see `stoppable`)."""
    run_step = run_step if cancel is None else stoppable(run_step, cancel)
    run_encoder = run_encoder if cancel is None else stoppable(run_encoder, cancel, BEFORE)  # a caller's: not watched
    states = run_encoder({"source": source, "source_mask": source_mask})
    states["source_mask"] = source_mask
    feed = {name: states[name] for name in step_inputs}
    outputs, alphas = [], []
    for _ in range(target_len):
        result = run_step(feed)
        outputs.append(result["output"])  # (N, 1, F)
        if "alphas" in result:
            alphas.append(result["alphas"])  # (N, [heads,] 1, Ls)
        feed["decoder_input"], feed["hidden"] = result["output"], result["hidden_out"]
    attention = np.concatenate(alphas, axis=-2) if alphas else None
    return np.concatenate(outputs, axis=1), attention
