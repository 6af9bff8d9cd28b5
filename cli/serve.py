"""`seq2onnx serve MODEL_DIR`: deploy the model on Ray Serve and serve HTTP until Ctrl-C (or SIGTERM).

Everything that can be checked here is checked before Ray starts: the options, the model (loaded once in this
process), and that the port is free."""
from __future__ import annotations

import errno
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import click

from runtime.errors import Seq2OnnxError
from runtime.points import MAX_TARGET_LEN
from runtime.sessions import PROVIDERS
from serving.config import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DECODING,
    MAX_BATCH_LIMIT,
    Replicas,
    ServeConfig,
    parse_replicas,
)

from .cluster import check_reachable, join_failed
from .common import Interrupted, require

APP_NAME = "seq2onnx"
PROXY_LOCATIONS = {"head": "HeadOnly", "every-node": "EveryNode"}


class Stopped(Exception):
    """SIGTERM: stop serving as Ctrl-C does."""


def _replicas_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        parse_replicas(value)
    except Seq2OnnxError as exc:
        raise click.BadParameter(str(exc).removeprefix("replicas: "), ctx=ctx, param=param) from None
    return value


def _name_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        raise click.BadParameter(f"expected letters, digits, '_', '.', '-' (at most 64), got {value!r}",
                                 ctx=ctx, param=param)
    return value


def _prefix_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.fullmatch(r"/([A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*)?", value):
        raise click.BadParameter(f"expected '/' or a path such as /dates (no trailing '/'), got {value!r}",
                                 ctx=ctx, param=param)
    return value


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process holds, before Ray starts (Serve would only log the failure)."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(f"--port {port}: {host}:{port} is already in use; stop what holds it or "
                                       "pick another --port") from None
        raise click.ClickException(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); "
                                   "use an address of this machine such as 127.0.0.1") from None


def check_model(model_dir: Path, provider: str) -> str:
    """Load the model once here, so a bad directory fails in a second rather than in every replica."""
    from runtime.model import Seq2Seq

    try:
        model = Seq2Seq.load(model_dir, provider=provider, threads=1)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    return model.spec.kind


@click.command("serve")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the HTTP server listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP port.")
@click.option("--replicas", default="1", show_default=True, callback=_replicas_option,
              help="N replicas, MIN:MAX autoscaling bounds, or 'auto' (1 to what the cluster's CPUs hold).")
@click.option("--num-cpus", type=click.FloatRange(0.01, 1024), default=1.0, show_default=True,
              help="CPUs reserved per replica; onnxruntime runs that many intra-op threads (at least 1).")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True,
              help="Execution provider in every replica.")
@click.option("--max-batch-size", type=click.IntRange(1, MAX_BATCH_LIMIT), default=32, show_default=True,
              help="Most items (sources or texts) decoded together, summed over merged requests; also the most "
                   "items one request may hold.")
@click.option("--batch-wait-ms", type=click.FloatRange(0, 10_000), default=5.0, show_default=True,
              help="How long a batch waits for more requests after its first.")
@click.option("--max-body-bytes", type=click.IntRange(1024, 1 << 30), default=DEFAULT_MAX_BODY_BYTES,
              show_default=True, help="Largest request body accepted (413 beyond).")
@click.option("--request-timeout", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True,
              help="Seconds before a request is answered 408 instead of waiting on.")
@click.option("--proxy-location", type=click.Choice(["head", "every-node"]), default="every-node", show_default=True,
              help="Where Serve runs HTTP proxies: every node (put a load balancer in front) or the head only.")
@click.option("--max-decoding-length", type=click.IntRange(1, MAX_TARGET_LEN), default=DEFAULT_MAX_DECODING,
              show_default=True, help="Most output tokens (points: target_len) a request may ask for; the model's "
                                      "own length is always allowed.")
@click.option("--name", default=APP_NAME, show_default=True, callback=_name_option,
              help="The Serve application's name (one per model on a shared cluster).")
@click.option("--route-prefix", default="/", show_default=True, callback=_prefix_option,
              help="URL prefix of the routes, for several models behind one Serve.")
@click.option("--address", default=None,
              help="Deploy onto an existing Ray cluster (ray start --head prints it); the model directory is "
                   "shipped to its nodes. Default: start Ray on this machine.")
def serve_command(model_dir: Path, host: str, port: int, replicas: str, num_cpus: float, provider: str,
                  max_batch_size: int, batch_wait_ms: float, max_body_bytes: int, max_decoding_length: int,
                  request_timeout: float, proxy_location: str, name: str, route_prefix: str,
                  address: str | None) -> None:
    """Serve the exported model in MODEL_DIR over HTTP on Ray Serve, with dynamic batching.

    POST /v1/predict (point models) or /v1/translate (token models); GET /v1/model, /healthz; /docs."""
    require(("fastapi", "ray.serve"), "Ray Serve and FastAPI", "serve", "serve")
    kind = check_model(model_dir, provider)
    if address is None:
        check_port_free(host, port)
    else:
        check_reachable(address)
    import ray
    from ray import serve

    started, deployed = _start_ray(address, model_dir), False
    try:
        config = ServeConfig(provider=provider, num_cpus=num_cpus, max_batch_size=max_batch_size,
                             batch_wait_ms=batch_wait_ms, max_body_bytes=max_body_bytes,
                             max_decoding_length=max_decoding_length, replicas=_resolve_replicas(replicas, num_cpus))
        url = _http_url(serve.status(), name, host, port)
        deployed = True  # from here on, what is on the cluster under `name` is ours to remove
        http = {"host": host, "port": port, "request_timeout_s": request_timeout}
        _deploy(model_dir, config, http, PROXY_LOCATIONS[proxy_location], name, route_prefix, address is not None)
        route = route_prefix.rstrip("/") + ("/v1/predict" if kind == "points" else "/v1/translate")
        click.echo(f"serve: {model_dir} at {url}{route_prefix.rstrip('/')} (POST {route}; GET /v1/model, /healthz; "
                   f"docs at /docs); {_describe(config.replicas)} of {num_cpus:g} CPU each; Ray at "
                   f"{ray.get_runtime_context().gcs_address}; Ctrl-C stops", err=True)
        _wait()
    except KeyboardInterrupt:  # Ctrl-C before the server was up (after, _wait returns)
        raise Interrupted("serve: interrupted while starting; what had started is stopped") from None
    finally:
        if deployed or started:
            _stop(name, on_cluster=not started)
        if started:
            ray.shutdown()
    click.echo("serve: stopped", err=True)


def _http_url(status: Any, name: str, host: str, port: int) -> str:
    """Refuse a name already deployed on the cluster; the URL clients use (a running Serve keeps its own HTTP
    options, whatever --host/--port/--request-timeout/--proxy-location say)."""
    if name in status.applications:
        raise click.ClickException(f"--name {name}: an application of that name already runs on this Ray cluster; "
                                   "pick another --name (and --route-prefix), or stop that one first")
    if status.proxies:
        click.echo("serve: note: Serve already runs on this cluster, so its HTTP proxy keeps the options it was "
                   "started with; --host, --port, --request-timeout and --proxy-location do not apply", err=True)
        return "(the running Serve's address)"
    return f"http://{host}:{port}"


def _start_ray(address: str | None, model_dir: Path) -> bool:
    """Connect to the cluster at `address`, shipping the model directory as this job's working directory (Ray
    uploads it, and every replica starts in its own copy on whatever node), or start a local Ray; True when this
    process started it."""
    import ray

    try:
        if address is None:
            ray.init(address="local", include_dashboard=False)  # never attach to a Ray someone else runs here
        else:
            ray.init(address=address, runtime_env={"working_dir": str(model_dir.resolve())})
    except (ConnectionError, ValueError, RuntimeError) as exc:
        if address is None:
            raise click.ClickException(f"serve: could not start a local Ray ({_first_line(exc)})") from None
        raise join_failed(address, _first_line(exc)) from None
    return address is None


def _resolve_replicas(text: str, num_cpus: float) -> Replicas:
    import ray

    return parse_replicas(text, ray.cluster_resources().get("CPU"), num_cpus)


def _deploy(model_dir: Path, config: ServeConfig, http: dict[str, Any], proxy_location: str, name: str,
            route_prefix: str, shipped: bool) -> None:
    """Start Serve's HTTP proxy and run the application; a replica that cannot start fails the command."""
    from ray import serve

    from serving.app import build_app

    serve.start(http_options=http, proxy_location=proxy_location)
    app = build_app(None if shipped else model_dir, config)  # None: each replica's working directory
    try:
        serve.run(app, name=name, route_prefix=route_prefix)
    except Exception as exc:  # Serve raises its own types for a deployment that failed to start
        raise click.ClickException(f"serve: the deployment failed to start: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _describe(replicas: Replicas) -> str:
    return (f"{replicas.low} replica{'s' if replicas.low > 1 else ''}" if replicas.fixed
            else f"{replicas.low} to {replicas.high} replicas (autoscaling)")


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Stopped


def _wait() -> None:
    """Block until Ctrl-C or SIGTERM."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        while True:
            time.sleep(1.0)
    except (KeyboardInterrupt, Stopped):
        click.echo("serve: stopping", err=True)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(name: str, on_cluster: bool) -> None:
    """Remove what this command deployed: its application on a shared cluster, all of Serve on its own Ray."""
    from ray import serve

    try:
        if on_cluster:
            serve.delete(name)
        else:
            serve.shutdown()
    except Exception as exc:  # stopping must not hide why we stop; say what could not be cleaned
        click.echo(f"serve: note: could not stop Serve cleanly ({_first_line(exc)})", err=True)
