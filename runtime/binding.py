"""IO binding: decoder state that stays on the execution device between calls.

With the CUDA provider, `session.run` copies every input to the GPU and every output back, once per step: the
hidden state, a transformer's whole cache, the encoder's keys and values. A `BoundRunner` binds inputs and outputs
instead: state outputs stay on the device as `OrtValue`s and go straight into the next call; only what the host
reads (log-probs, outputs, attention) is copied back. Inputs may be numpy arrays (copied in) or device values.

Strategies stay model- and device-agnostic: `runtime.search.step.select` reorders a device value by copying it to
the host first (its `numpy()`), and the next call moves it back.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Callable

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as ort_cpp

from .denormals import clear_on_this_thread
from .errors import RUN_FAILED_ADVICE, Cancelled, InputError, ResourceError, brief, one_line
from .points import asked

DEVICE_TYPES = {"CUDAExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}
# A graph runner takes a feed {input name: array} (and optionally a `cancel` to watch the run with) and returns
# {output name: array (or device value)}.
Runner = Callable[..., dict[str, Any]]


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape of a numpy array or an OrtValue (whose shape is a method); () for anything else in a feed."""
    shape = getattr(value, "shape", ())
    return tuple(shape() if callable(shape) else shape)


class Watchdog:
    """Asks the `cancel` of every watched run each POLL_S, from POLL_S after it was watched (its caller has just
    asked), and sets onnxruntime's terminate flag on the run whose caller says stop: a graph that decodes in one
    call (the greedy loop, the beam graph) stops within milliseconds, between two of its kernels, instead of running
    to its end (a graph that is one long kernel, a recurrent encoder's GRU, stops when that kernel ends).

    One daemon thread polls; up to ASKERS daemon threads ask, each run's cancel on one of them and never twice at
    once, so a cancel that blocks holds one asker and the other runs' cancels are still asked. A cancel that raises,
    anything at all, counts as "go on" here, and the run's caller asks it once more on its own thread when the run
    ends (`unwatch` says so), where what it raises reaches the caller. A forked child starts afresh: the parent's
    threads do not exist there."""

    POLL_S = 0.005
    ASKERS = 4
    # How long the poll thread keeps ticking after the last watched run ended before it sleeps until the next: a
    # service's next call then finds it awake and wakes no thread (waking it, and asking at once, cost a batch-1
    # call 17-33 us; benchmarks/RESULTS.md). Idle, 1 s of ticks is ~200 wakeups; then none.
    LINGER_S = 1.0

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._runs: dict[int, tuple[ort.RunOptions, Callable[[], bool], float]] = {}  # with when it was watched
        self._sleeping = False  # the poll thread waits for a run (notify it), rather than ticking
        self._asking: set[int] = set()  # runs whose cancel an asker holds now
        self._raised: set[int] = set()  # watched runs whose cancel raised on an asker
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._asks: queue.SimpleQueue[tuple[int, ort.RunOptions, Callable[[], bool]]] = queue.SimpleQueue()
        self._askers = self._idle = 0

    def watch(self, options: ort.RunOptions, cancel: Callable[[], bool]) -> None:
        with self._wake:
            self._runs[id(options)] = (options, cancel, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="seq2onnx-watchdog", daemon=True)
                self._thread.start()
            elif self._sleeping:
                self._wake.notify()

    def unwatch(self, options: ort.RunOptions) -> bool:
        """Stop watching a run: whether its cancel raised when asked here (its caller then asks it again)."""
        with self._wake:
            self._runs.pop(id(options), None)
            if id(options) in self._raised:
                self._raised.discard(id(options))
                return True
            return False

    def _loop(self) -> None:
        busy = time.monotonic()
        while True:
            with self._wake:
                now = time.monotonic()
                if self._runs:
                    busy = now
                elif now - busy >= self.LINGER_S:
                    self._sleeping = True
                    while not self._runs:
                        self._wake.wait()
                    self._sleeping = False
                    busy = now = time.monotonic()
                # A run's caller asked its cancel just before it started: the first ask here is a poll later, so a
                # short run is never asked twice. An ask in flight holds its options alive, so no new run can take
                # its id before it ends.
                due = [(key, options, cancel) for key, (options, cancel, since) in self._runs.items()
                       if since <= now - self.POLL_S and key not in self._asking]
                self._asking.update(key for key, _, _ in due)
                short = len(due) + self._asks.qsize() - self._idle  # asks no waiting asker would take
                for _ in range(max(0, min(short, self.ASKERS - self._askers))):
                    threading.Thread(target=self._ask, name="seq2onnx-watchdog-ask", daemon=True).start()
                    self._askers += 1
            for item in due:
                self._asks.put(item)
            time.sleep(self.POLL_S)

    def _ask(self) -> None:
        clear_on_this_thread()  # started from a decode, perhaps a flushed one: callers' cancels run as they would
        while True:
            with self._wake:
                self._idle += 1
            key, options, cancel = self._asks.get()
            with self._wake:
                self._idle -= 1
                ended = self._runs.get(key, (None,))[0] is not options
            try:
                if not ended and bool(cancel()):  # an ask queued for a run that has ended is dropped
                    options.terminate = True
            except BaseException:  # noqa: BLE001 - a broken cancel must not end an asker: its run's caller asks again
                with self._wake:
                    if self._runs.get(key, (None,))[0] is options:
                        self._raised.add(key)
            finally:
                with self._wake:
                    self._asking.discard(key)
            del options, cancel


WATCHDOG = Watchdog()
os.register_at_fork(after_in_child=WATCHDOG._start)  # its threads are the parent's


SHORT_OF_MEMORY = ("Failed to allocate memory", "bad_alloc", "Cannot allocate memory")  # onnxruntime's words for it


def quiet_run_options() -> ort.RunOptions:
    """Run options that keep onnxruntime's own log line of a failed run off stderr: the runner raises the failure as
    an InputError naming the graph, and a service's log would hold it twice. Passing options is also 0.6-0.9 us faster
    a call than None, for which onnxruntime makes a default set every run (a bare Identity graph, 1 thread, three
    runs: 2.8 against 3.8, 2.1 against 2.8 and 2.3 against 3.0 us; benchmarks/RESULTS.md). Only read by a run, so
    one set serves every thread."""
    options = ort.RunOptions()
    options.log_severity_level = 4
    return options


QUIET = quiet_run_options()


class SessionRunner:
    """`session.run` by output name, onnxruntime's untyped failures raised naming the graph: a run short of memory
    (a huge batch, or a process limit) as ResourceError with RUN_FAILED_ADVICE, any other (a bad hand-made feed) as
    InputError. With `cancel`, the run is watched (`Watchdog`) and stops with Cancelled
    as soon as `cancel()` says so; where it raised on the watchdog's thread, it is asked again on the caller's when
    the run ends, so that what it raises there, or a stop, reaches the caller (a decode driven from Python asks it
    between steps anyway; a one-call graph's run is the whole decode)."""

    def __init__(self, session: Any, outputs: list[str], name: str) -> None:
        self.session, self.outputs, self.name = session, list(outputs), name
        self.direct = direct_run(session)

    def __call__(self, feed: dict[str, Any], cancel: Callable[[], bool] | None = None) -> dict[str, Any]:
        options, raised = QUIET, False
        if cancel is not None:
            options = quiet_run_options()  # its own: the watchdog terminates this run alone
            WATCHDOG.watch(options, cancel)
        try:
            outputs = dict(zip(self.outputs, self._run(feed, options)))
        except Exception as exc:
            if cancel is not None and options.terminate:
                raise Cancelled(f"{self.name}: cancelled by its caller while it ran (a deadline passed or the "
                                "client went away)") from None
            inputs = self.session.get_inputs() if hasattr(self.session, "get_inputs") else []
            declared = [i.name for i in inputs]
            missing = [i.name for i in inputs if i.name not in feed and not i.type.startswith("optional")]
            if missing:  # a hand-made feed: the C++ run names only the first, from inside the kernel that needed it
                raise InputError(f"{self.name}: the feed has no {', '.join(missing)}; the graph reads "
                                 f"{', '.join(declared)}") from None
            shapes = {k: shape_of(v) for k, v in feed.items()}
            said = f"{self.name}: onnxruntime could not run on inputs of shapes {brief(shapes)} ({one_line(exc)})"
            if any(words in str(exc) for words in SHORT_OF_MEMORY):  # the process's memory, not the input's values
                raise ResourceError(said + RUN_FAILED_ADVICE) from None
            raise InputError(said) from None
        finally:
            if cancel is not None:
                raised = WATCHDOG.unwatch(options)
        if raised and asked(cancel):  # its error, if it raises again, passes through
            raise Cancelled(f"{self.name}: cancelled by its caller as it ended (a deadline passed or the client went "
                            "away)")
        return outputs

    def _run(self, feed: dict[str, Any], options: ort.RunOptions = QUIET) -> list[Any]:
        return self.direct(self.outputs, feed, options)


def direct_run(session: Any) -> Callable[..., list[Any]]:
    """An onnxruntime session's C++ `run` (its Python session's `_sess.run`, same arguments), else `session.run`.
    The Python `run` first checks that every input is fed, that no OrtValue comes from another session and that
    WebGPU graph capture is off: 10-20 us a call at batch 1, run cold after a graph (the dates transformer's beam 5
    call 0.987x and 0.992x the time without them, greedy 0.996x; interleaved, 1 thread). The runtime's feeds are
    numpy arrays made for the graph's declared inputs, and a missing one still fails, in the C++ run (InputError)."""
    inner = getattr(session, "_sess", None)
    return inner.run if isinstance(inner, ort_cpp.InferenceSession) else session.run


class BoundRunner(SessionRunner):
    """Runs one session with IO binding; outputs named in `keep` stay on the session's device as OrtValues, the
    others come back as numpy arrays. Inputs may be numpy arrays or OrtValues.

    It binds and runs through onnxruntime's C++ objects (the session's `_sess`), not the Python `IOBinding` and
    `run_with_iobinding`: those wrap every bind and output in Python and look up the run options' `gpu_graph_id`
    (WebGPU capture) by raising and catching a C++ exception when it is unset, ~60 us a call. On the dates GRU's
    beam 5 at batch 1 (one bound beam step a token) that made the bound call 1.78-1.81x the unbound one's time on an
    AMD EPYC's one thread, and 1.37-1.40x on an H200 (README, IO binding); through the C++ objects 1.14-1.16x and
    1.06x."""

    def __init__(self, session: Any, outputs: list[str], name: str, keep: set[str], device_id: int = 0) -> None:
        super().__init__(session, outputs, name)
        self.keep = set(keep)
        self.device = DEVICE_TYPES.get(session.get_providers()[0], "cpu")
        self.device_id = device_id if self.device != "cpu" else 0
        inner = getattr(session, "_sess", None)
        self.inner = inner if isinstance(inner, ort_cpp.InferenceSession) else None
        self.devices = {where: ort.OrtDevice.make(where, self.device_id if where != "cpu" else 0)._get_c_device()
                        for where in {self.device, "cpu"}} if self.inner is not None else {}

    def _run(self, feed: dict[str, Any], options: ort.RunOptions = QUIET) -> list[Any]:
        kept = [name in self.keep for name in self.outputs]
        if self.inner is None:  # not onnxruntime's own session class: its public binding
            return self._public_run(feed, kept, options)
        binding = ort_cpp.SessionIOBinding(self.inner)
        arrays = []  # a bound numpy input is read from its own buffer: held until the run has read it
        for name, value in feed.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value._ortvalue)
            else:
                arrays.append(np.ascontiguousarray(value))
                binding.bind_input(name, arrays[-1])
        for name, keep in zip(self.outputs, kept):
            binding.bind_output(name, self.devices[self.device if keep else "cpu"])
        self.inner.run_with_iobinding(binding, options)
        values = binding.get_outputs()
        binding.clear_binding_inputs()
        return [ort.OrtValue(values[i]) if keep else values[i].numpy() for i, keep in enumerate(kept)]

    def _public_run(self, feed: dict[str, Any], kept: list[bool], options: ort.RunOptions) -> list[Any]:
        binding = self.session.io_binding()
        for name, value in feed.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name, keep in zip(self.outputs, kept):
            binding.bind_output(name, self.device if keep else "cpu", self.device_id if keep else 0)
        self.session.run_with_iobinding(binding, options)
        return [v if keep else v.numpy() for keep, v in zip(kept, binding.get_outputs())]


def runner(session: Any, outputs: list[str], name: str, bind: bool, keep: set[str], device_id: int) -> Runner:
    """A BoundRunner keeping `keep` on the device when `bind`, else a plain SessionRunner."""
    return BoundRunner(session, outputs, name, keep, device_id) if bind else SessionRunner(session, outputs, name)
