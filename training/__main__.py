"""`python -m training ARGS` is `seq2onnx train ARGS`: the entry point torchrun starts on every rank, e.g.
`torchrun --standalone --nproc-per-node 2 -m training --data reverse --out ckpt`.

A rank ends with `os._exit` once its output is flushed, whatever its status, instead of through interpreter
shutdown: gloo's worker may still be dropping the rank's last collective, which takes the GIL, and CPython ends a
thread that asks for it during shutdown in a way that aborts the process (see training.distributed). A run that
ends normally has met the other ranks first (`leave`), which settles that; a rank that stops on an error leaves
at once, so this is what keeps its status and its one-line message.
"""
import os
import sys

from cli import QUIET, one_blas_thread, starting_handlers


def run(args: list[str]) -> int:
    """`seq2onnx train ARGS`; its exit status. Ctrl-C, SIGTERM or SIGHUP while the program loads is its one line
    (none on a rank other than 0 of a run, whose rank 0 says it), as for `seq2onnx`: it was a KeyboardInterrupt
    traceback."""
    from training.torchrun import quiet_rank  # light and torch-free: Python's defaults still hold, as at start-up

    if quiet_rank():  # decided before the handlers go in: a stop right after them is silent on such a rank too
        QUIET.append(True)
    starting_handlers(install=True)  # before anything heavy loads
    one_blas_thread()  # (a rank torchrun started by hand: one our launcher started has it from its environment)
    from cli.main import entry

    try:
        entry(["train", *args])
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    status = run(sys.argv[1:])
    try:
        sys.stdout.flush()
    except OSError:  # a stdout that cannot take its lines: they were messages (cli.streams), not the run's result
        pass
    sys.stderr.flush()
    os._exit(status)
