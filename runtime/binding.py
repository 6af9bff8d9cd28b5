"""IO binding: decoder state that stays on the execution device between calls.

With the CUDA provider, `session.run` copies every input to the GPU and every output back, once per step: the
hidden state, a transformer's whole cache, the encoder's keys and values. A `BoundRunner` binds inputs and outputs
instead: state outputs stay on the device as `OrtValue`s and go straight into the next call; only what the host
reads (log-probs, outputs, attention) is copied back. Inputs may be numpy arrays (copied in) or device values.

Strategies stay model- and device-agnostic: `runtime.search.step.select` reorders a device value by copying it to
the host first (its `numpy()`), and the next call moves it back.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnxruntime as ort

from .errors import InputError, brief, one_line

DEVICE_TYPES = {"CUDAExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}
# A graph runner takes a feed {input name: array} and returns {output name: array (or device value)}.
Runner = Callable[[dict[str, Any]], dict[str, Any]]


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape of a numpy array or an OrtValue (whose shape is a method); () for anything else in a feed."""
    shape = getattr(value, "shape", ())
    return tuple(shape() if callable(shape) else shape)


class SessionRunner:
    """`session.run` by output name, onnxruntime's untyped failures (memory for a huge batch, a bad hand-made feed)
    raised as InputError naming the graph."""

    def __init__(self, session: Any, outputs: list[str], name: str) -> None:
        self.session, self.outputs, self.name = session, list(outputs), name

    def __call__(self, feed: dict[str, Any]) -> dict[str, Any]:
        try:
            return dict(zip(self.outputs, self._run(feed)))
        except Exception as exc:
            shapes = {k: shape_of(v) for k, v in feed.items()}
            raise InputError(f"{self.name}: onnxruntime could not run on inputs of shapes {brief(shapes)} "
                             f"({one_line(exc)}); pass a smaller batch or shorter sources") from None

    def _run(self, feed: dict[str, Any]) -> list[Any]:
        return self.session.run(self.outputs, feed)


class BoundRunner(SessionRunner):
    """Runs one session with IO binding; outputs named in `keep` stay on the session's device as OrtValues, the
    others come back as numpy arrays. Inputs may be numpy arrays or OrtValues."""

    def __init__(self, session: Any, outputs: list[str], name: str, keep: set[str], device_id: int = 0) -> None:
        super().__init__(session, outputs, name)
        self.keep = set(keep)
        self.device = DEVICE_TYPES.get(session.get_providers()[0], "cpu")
        self.device_id = device_id if self.device != "cpu" else 0

    def _run(self, feed: dict[str, Any]) -> list[Any]:
        binding = self.session.io_binding()
        for name, value in feed.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in self.outputs:
            kept = name in self.keep
            binding.bind_output(name, self.device if kept else "cpu", self.device_id if kept else 0)
        self.session.run_with_iobinding(binding)
        return [v if name in self.keep else v.numpy() for name, v in zip(self.outputs, binding.get_outputs())]


def runner(session: Any, outputs: list[str], name: str, bind: bool, keep: set[str], device_id: int) -> Runner:
    """A BoundRunner keeping `keep` on the device when `bind`, else a plain SessionRunner."""
    return BoundRunner(session, outputs, name, keep, device_id) if bind else SessionRunner(session, outputs, name)
