"""Child processes that a test can interrupt (SIGINT reaches them) and never leaves running."""
from __future__ import annotations

import contextlib
import subprocess
from typing import Iterator


def _default_sigint() -> None:
    import signal

    # A shell that starts jobs in the background ignores SIGINT for them, and children inherit that;
    # the tests send SIGINT on purpose, so the child gets the default handler back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def child_process(args: list[str], **kwargs: object) -> Iterator[subprocess.Popen]:
    """Popen that receives SIGINT whatever the test runner inherited, and is killed if the test leaves it running."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
