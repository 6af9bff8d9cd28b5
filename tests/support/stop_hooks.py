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


def hook_path(root: Path, hook: str) -> str:
    """A PYTHONPATH that makes `hook` the sitecustomize of every Python process started with it."""
    folder = root / "hook"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(hook)
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
