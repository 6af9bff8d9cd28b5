"""Helpers for the serving tests: a free loopback port, a local Ray started and torn down by the test, an HTTP
wait."""
from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Iterator

import httpx

ROOT = Path(__file__).resolve().parents[2]
SQUARES = ROOT / "artifacts" / "squares"
DATES = ROOT / "artifacts" / "dates"
# a request for DATES that decodes for seconds on one thread (10,000 steps of 128 beams; serve --max-decoding-length
# 10000 --max-beam-size 128, LONG_BOUNDS): ~2.0 s on a Zen 5 core, the fastest seen; the tests that cut it short do so
# within 0.8 s
LONG = {"texts": ["3/3/15"], "beam_size": 128, "min_decoding_length": 10_000, "max_decoding_length": 10_000}
LONG_BOUNDS = ("--max-decoding-length", "10000", "--max-beam-size", "128")
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage-stats reporting from test clusters


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def ray_env(**extra: str) -> Iterator[dict[str, str]]:
    """RAY_ENV and `extra` set for the duration (Ray's child processes inherit them), then restored."""
    wanted = {**RAY_ENV, **extra}
    # ray.init also sets RAY_AUTH_MODE=token here (joining children need it while it runs): restored as well
    saved = {key: os.environ.get(key) for key in [*wanted, "RAY_AUTH_MODE"]}
    os.environ.update(wanted)
    try:
        yield {**os.environ}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def local_ray(num_cpus: int = 2, address: str | None = None) -> Iterator[None]:
    """ray.init (a new local Ray, or the cluster at `address`), then Serve and Ray shut down whatever happens."""
    import ray
    from ray import serve

    with ray_env():
        if address is None:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()


def wait_healthy(url: str, timeout: float, process: object = None) -> None:
    """Poll GET url until 200; fail after `timeout` seconds or when `process` (a Popen) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:  # type: ignore[attr-defined]
            raise AssertionError(f"the server exited with {process.returncode} before {url} answered")  # type: ignore
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 200 within {timeout} s")


@contextlib.contextmanager
def embedded(mounts: dict[str, tuple[Path, object]], port: int) -> Iterator[dict[str, object]]:
    """The one-process server in a thread of this process, on 127.0.0.1:`port`: one app per prefix
    ({prefix: (model_dir, ServeConfig)}), each over its own service; stopped (and joined) at the end. Yields the
    services by prefix."""
    import threading

    import uvicorn
    from fastapi import FastAPI

    from serving.http import attach, create_app
    from serving.server import Server, load_service

    outer = FastAPI()
    services = {prefix: load_service(model_dir, config) for prefix, (model_dir, config) in mounts.items()}
    for prefix, service in services.items():
        outer.mount(prefix, attach(create_app(), service))
    server = Server(uvicorn.Config(outer, host="127.0.0.1", port=port, log_level="warning", lifespan="off"),
                    lambda: None)
    thread = threading.Thread(target=server.run, name="embedded-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the embedded server did not start"
    try:
        yield services
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        for service in services.values():
            service.close()
        assert not thread.is_alive(), "the embedded server did not stop"
