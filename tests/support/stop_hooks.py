"""Stops sent at a chosen moment of a `train` run, by a `sitecustomize` module on the path of the processes it
starts (the program, or torchrun's ranks, which inherit the environment): the moments no sleep can hit reliably."""
from __future__ import annotations

import os
from pathlib import Path

# Rank 0 sends SIGTERM to its launcher as soon as it has published the checkpoint: a service manager's stop in the
# last moments of a run.
AFTER_PUBLISH = """
import os, signal
if os.environ.get("RANK") == "0":
    import training.run as run
    real = run._write
    def _write(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getppid(), signal.SIGTERM)
    run._write = _write
"""

# SIGTERM at the end of the first epoch, before its state is saved: to the program itself, or, from rank 0 of a
# launched run, to the launcher (rank 0 then waits for the SIGTERM torchrun passes on, saving nothing).
BEFORE_THE_FIRST_SAVE = """
import os, signal, time
if os.environ.get("RANK", "0") == "0":
    import training.run as run
    real = run._fit
    def _fit(job, *args, **kwargs):
        fit = job.trainer.fit
        def stopped_fit(save_state, **options):
            def first(trainer):
                if "RANK" in os.environ:
                    os.kill(os.getppid(), signal.SIGTERM)
                    time.sleep(60)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(60)
            return fit(first, **options)
        job.trainer.fit = stopped_fit
        return real(job, *args, **kwargs)
    run._fit = _fit
"""

# SIGTERM to the program itself as the second state save begins (--save-every 1: after epoch 2), landing inside the
# save: it cut the save, and the state kept was epoch 1's, though epoch 2 was trained.
DURING_THE_SECOND_SAVE = """
import os, signal
import training.run as run
real, calls = run.save_train_state, []
def save_train_state(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    real(*args, **kwargs)
run.save_train_state = save_train_state
"""

# The program, with SIGTERM sent to itself as soon as a --resume has noted what it resumes (cli.train._keeps): a stop
# while it starts, before anything is trained or saved.
AS_A_RESUME_STARTS = """
import os, signal, sys
def stop(frame, event, arg):
    if event == "return" and frame.f_code.co_name == "_keeps":
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGTERM)
sys.setprofile(stop)
from cli.main import entry
sys.argv[0] = "seq2onnx"
entry()
"""

# torch's allocator refusing memory in epoch 3, once epoch 2's state is saved (--save-every 1): what `ulimit -v` did
# to a run at ~600 MB, at a moment of our choosing.
OUT_OF_MEMORY_IN_THE_THIRD_EPOCH = """
import torch
import training.run as run
real, calls = run.save_train_state, []
def save_train_state(*args, **kwargs):
    real(*args, **kwargs)
    calls.append(1)
    if len(calls) == 2:
        def backward(*args, **kwargs):
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate "
                               "memory: you tried to allocate 1048576 bytes. Error code 12 (Cannot allocate memory)")
        torch.Tensor.backward = backward
run.save_train_state = save_train_state
"""

# The loader finding no room for matplotlib's libraries as the checkpoint's loss.png is drawn, after the last epoch's
# state is saved: what `ulimit -v` did at 700-760 MB.
OUT_OF_MEMORY_WRITING_THE_CHECKPOINT = """
import training.checkpoint as checkpoint
def plot_history(*args, **kwargs):
    raise ImportError("libXau-154567c4.so.6.0.0: failed to map segment from shared object")
checkpoint.plot_history = plot_history
"""

# An exit callback that finds no memory, as torch's (dump_compile_times importing tabulate) did under `ulimit -v`:
# Python printed "Exception ignored in atexit callback" and its traceback after the command's one line.
NO_MEMORY_AT_EXIT = """
import atexit, errno
def callback():
    raise OSError(errno.ENOMEM, "Cannot allocate memory", "/tmp")
atexit.register(callback)
"""


def hook_path(root: Path, hook: str) -> str:
    """A PYTHONPATH that makes `hook` the sitecustomize of every Python process started with it."""
    folder = root / "hook"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(hook)
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
