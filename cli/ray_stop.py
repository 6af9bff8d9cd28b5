"""How `seq2onnx serve --ray` stops on SIGTERM or Ctrl-C, whatever it was doing at the time.

Every call into Ray runs on one thread of its own (start, serve and stop alike: Serve's client stalled 30 s when shut
down from another thread than the one that started it), so a signal never lands inside one. Raised there, as
Python raises KeyboardInterrupt, it left Ray's agents running after an interrupted `ray.init`, and turned into a
SystemError traceback (exit 1) inside `serve.start`. The main thread only turns signals into a request the Ray thread
reads between its steps, then lets it stop what it started. A second signal, or a stop that outlasts its deadline,
kills the processes this command started (the local Ray) and exits at once."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import click

POLL_S = 0.05  # how often the main thread looks at signals, the deadline, and whether Ray is up
SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_INTERRUPTED = 130
EXIT_FAILED = 1


class Stop:
    """Stop requests, shared by the main thread (which receives the signals) and the Ray thread (which acts)."""

    def __init__(self) -> None:
        self.requested = threading.Event()  # a signal came: stop at the next step, or now while serving
        self.stopping = threading.Event()  # the Ray thread is stopping what it started (on a request or a failure)
        # Ray is up: its core worker put a C++ handler on SIGTERM (it logs and aborts): the main thread puts ours back
        self.connected = threading.Event()
        self.signals = 0

    def on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1
        self.requested.set()


def drive(work: Callable[[Stop], None], deadline_s: float, note: str = "") -> bool:
    """Run `work(stop)` on a thread of its own until it returns, this (the main) thread taking SIGTERM and SIGINT.
    Stopping, once asked for or once `work` says it began, may take `deadline_s`; past that, or on a second
    signal, the processes this one started are killed and the process exits (`note`: what may outlive it).
    Returns whether a signal asked to stop; raises what `work` raised."""
    stop, failure = Stop(), []

    def run() -> None:
        try:
            work(stop)
        except BaseException as exc:  # handed to the main thread, which raises it
            failure.append(exc)

    thread = threading.Thread(target=run, name="seq2onnx-ray", daemon=True)
    previous = {sig: signal.signal(sig, stop.on_signal) for sig in SIGNALS}
    try:
        thread.start()
        deadline, rearmed = None, False
        while thread.is_alive():
            thread.join(POLL_S)
            if stop.connected.is_set() and not rearmed:
                for sig in SIGNALS:
                    signal.signal(sig, stop.on_signal)
                rearmed = True
            if stop.signals > 1:
                _kill_and_exit("a second signal while stopping", note, EXIT_INTERRUPTED)
            if deadline is None and (stop.requested.is_set() or stop.stopping.is_set()):
                deadline = time.monotonic() + deadline_s
            if deadline is not None and time.monotonic() > deadline and thread.is_alive():
                _kill_and_exit(f"Ray did not stop within --shutdown-timeout {deadline_s:g} s", note,
                               EXIT_INTERRUPTED if stop.requested.is_set() else EXIT_FAILED)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure:
        raise failure[0]
    return stop.requested.is_set()


def _kill_and_exit(why: str, note: str, code: int) -> None:
    """Kill every process this one started (and theirs), say so, and exit now: no cleanup runs after this."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(children, timeout=5)
    click.echo(f"serve: {why}: killed the {len(children)} processes this command had started{note}", err=True)
    sys.stderr.flush()
    os._exit(code)
