"""The one-process server, `seq2onnx serve`'s default: the HTTP app (`serving.http`) on uvicorn (uvloop and
httptools when installed) in this process, over one `Service`. No Ray here.

SIGTERM or Ctrl-C stop it gracefully: it stops accepting, lets the requests under way finish for up to
`shutdown_timeout_s`, then returns (a second Ctrl-C stops at once)."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from runtime.model import Seq2Seq

from .config import ServeConfig
from .http import attach, create_app
from .service import Service

DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Listen:
    """Where the server listens, and how long a graceful stop may take."""

    host: str = "127.0.0.1"
    port: int = 8000
    prefix: str = "/"
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S


class Server(uvicorn.Server):
    """uvicorn's server, stopped by SIGINT or SIGTERM without re-raising the signal afterwards (uvicorn's own
    handling does, which would end the process by the signal instead of exit 0); `on_ready` once it listens."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_ready = on_ready
        self.stopped_by: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # a test's server thread: its owner stops it
            yield
            return

        def stop(sig: int, frame: object) -> None:
            if self.should_exit:
                self.force_exit = True  # a second signal: stop waiting for the requests under way
            self.should_exit, self.stopped_by = True, sig

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self.on_ready()


class _CutOff(logging.Filter):
    """uvicorn's "ERROR: Cancel N running task(s), timeout graceful shutdown exceeded" on a stop that ran past
    --shutdown-timeout (a documented outcome: the requests cut off answer 503, the exit is 0) said as a serve line."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self.timeout_s = timeout_s

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Cancel %s running task(s), timeout graceful shutdown exceeded"):
            return True
        n = record.args[0] if isinstance(record.args, tuple) and record.args else "the"
        print(f"serve: --shutdown-timeout {self.timeout_s:g} s ran out with {n} request(s) under way: cut off, "
              "answered 503 where their client is still connected and no answer had started (the count below says "
              "how many were answered)", file=sys.stderr, flush=True)
        return False


def load_service(model_dir: str | Path, config: ServeConfig) -> Service:
    """The model loaded once, behind its service; named after this machine and process."""
    model = Seq2Seq.load(model_dir, provider=config.provider, threads=config.threads, workers=config.workers)
    return Service(model, config, name=f"{socket.gethostname()}:{os.getpid()}")


def make_server(service: Service, listen: Listen, on_ready: Callable[[], None] = lambda: None) -> Server:
    """A server of `service`'s app at `listen` (not started: `run()` it, or `serve()` it in a loop)."""
    app = attach(create_app(listen.prefix), service)
    config = uvicorn.Config(app, host=listen.host, port=listen.port, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=listen.shutdown_timeout_s, proxy_headers=False,
                            server_header=False)
    return Server(config, on_ready)


def serve_forever(model_dir: str | Path, config: ServeConfig, listen: Listen,
                  on_ready: Callable[[Service], None] = lambda service: None,
                  sock: socket.socket | None = None) -> tuple[int | None, Service]:
    """Serve until SIGINT or SIGTERM, then stop gracefully: (the signal that stopped it, None when it stopped by
    itself, e.g. the port was taken; the service, whose metrics tell what was answered). `sock`: a socket bound to
    `listen`'s address already (the port held while the model loads); else uvicorn binds it."""
    service = load_service(model_dir, config)
    server = make_server(service, listen, lambda: on_ready(service))
    cut_off = _CutOff(listen.shutdown_timeout_s)
    logging.getLogger("uvicorn.error").addFilter(cut_off)
    try:
        server.run(sockets=None if sock is None else [sock])
    finally:
        logging.getLogger("uvicorn.error").removeFilter(cut_off)
        service.close()
        if sock is not None:
            sock.close()
    return server.stopped_by, service
