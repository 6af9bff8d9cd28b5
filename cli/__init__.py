"""The `seq2onnx` command line: the group (`main`), one module per command, and what they share (`common`).

Each command parses and checks its options, then calls a typed function of the package that does the work.
Nothing outside this package imports it, and no module outside it imports click.
"""
from __future__ import annotations

import os  # (os and sys are loaded by Python's start-up already; no typing: the handlers go in first)
import signal
import sys

# exit code, words; a hang-up is a SIGTERM, as once a command runs (it died of SIGHUP without a word)
STARTING = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "stopped by SIGTERM"),
            signal.SIGHUP: (143, "stopped by SIGTERM")}
QUIET: list[bool] = []  # set: a rank other than 0 of a run (its rank 0 says it): the handlers above stop it silently


def _stopped_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM while the program imports its modules, before any command runs: one line and the exit code
    of a stop (raised there, Ctrl-C printed a KeyboardInterrupt traceback and SIGTERM killed it without a word)."""
    code, words = STARTING[signum]
    if not QUIET:
        os.write(2, f"Error: seq2onnx: {words} while starting; nothing was written\n".encode())
    os._exit(code)


def starting_handlers(install: bool) -> None:
    """Install the handlers above (as the program, while it starts), or put the defaults back where they are ours
    (once a command runs, whose own handling takes over)."""
    for sig in STARTING:
        current = signal.getsignal(sig)
        if install and current in (signal.default_int_handler, signal.SIG_DFL):  # an ignored signal stays ignored
            signal.signal(sig, _stopped_while_starting)
        elif not install and current is _stopped_while_starting:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def one_blas_thread() -> None:
    """numpy's OpenBLAS starts a pool of threads as numpy loads, which the program never uses (its numpy work makes
    no BLAS call; torch has its own BLAS): one thread, unless the user set OPENBLAS_NUM_THREADS. Each thread of the
    pool reserved ~50 MB of address space, so under `ulimit -v` 100-140 MB OpenBLAS ended the program with its own
    line ('Memory allocation still failed'), and `infer` needed 250 MB where 200 MB now decode."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _as_the_program() -> bool:
    """Imported by `seq2onnx` or `python -m cli` (a test importing the package keeps its handlers)."""
    return bool(sys.argv) and (sys.argv[0] == "-m" or os.path.basename(sys.argv[0]) == "seq2onnx")


if _as_the_program():  # the program's own process, before numpy loads: nothing of a library's importer changes
    starting_handlers(install=True)
    one_blas_thread()
