"""`seq2onnx serve MODEL_DIR`: serve the model over HTTP until Ctrl-C or SIGTERM: in this process (FastAPI on
uvicorn, `serving.server`) by default; on Ray Serve with --ray, implied by --address and by --replicas other than
1 (`cli.serve_ray`). Both run the same app and service: routes, schemas, limits, error shapes, batching.

Everything that can be checked here is checked before anything starts: the options, the model (loaded once in this
process), and that the port is free."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from runtime.defaults import MAX_TARGET_LEN, PROVIDERS
from runtime.errors import InputError, Seq2OnnxError
from runtime.search.beam import MAX_BEAM
from serving.config import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BEAM_SIZE,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_DECODING,
    DEFAULT_MAX_QUEUE,
    DEFAULT_REQUEST_TIMEOUT_S,
    MAX_BATCH_LIMIT,
    MAX_QUEUE_LIMIT,
    ServeConfig,
    parse_replicas,
)

from .allocator import SYSTEM
from .allocator import choose as choose_allocator
from .cluster import check_reachable
from .common import require
from .listen import check_port_free, listen_on
from .options import FiniteFloatRange, IntRange, address_option
from .serve_ray import STOP_RESERVE_S, in_url

APP_NAME = "seq2onnx"
PROXY_LOCATIONS = ("head", "every-node")
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0  # as serving.server's: --help stays free of uvicorn's import
# a start-up step under way, the drain, then Serve's and Ray's shutdown (~7.5 s idle here)
DEFAULT_RAY_SHUTDOWN_TIMEOUT_S = 30.0
RAY_ONLY = ("proxy_location", "name")  # options that mean something on Ray Serve only


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


def check_model(model_dir: Path, provider: str) -> str:
    """Load the model once here, so a bad directory fails in a second rather than in every replica."""
    from runtime.model import Seq2Seq

    try:
        model = Seq2Seq.load(model_dir, provider=provider, threads=1)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    return model.spec.kind


@click.command("serve", short_help="Serve an exported model over HTTP (--ray: on Ray Serve).")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the HTTP server listens on.")
@click.option("--port", type=IntRange(1, 65535), default=8000, show_default=True, help="HTTP port.")
@click.option("--replicas", default="1", show_default=True, callback=_replicas_option,
              help="Ray Serve: N replicas, MIN:MAX autoscaling bounds, or 'auto' (1 to what the cluster's CPUs "
                   "hold); other than 1 implies --ray.")
@click.option("--num-cpus", type=FiniteFloatRange(0.01, 1024), default=1.0, show_default=True,
              help="CPUs for decoding (per replica on Ray, where they are reserved); onnxruntime runs that many "
                   "intra-op threads (at least 1).")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True,
              help="Execution provider in every replica.")
@click.option("--workers", type=IntRange(1, 1024), default=1, show_default=True,
              help="Copies of the model in this process, each decoding a batch of its own at once on the "
                   "intra-op threads of --num-cpus (its whole part, at least 1); copies times threads may not pass "
                   "this machine's CPUs. Not with --ray, whose replicas are the copies.")
@click.option("--max-batch-size", type=IntRange(1, MAX_BATCH_LIMIT), default=32, show_default=True,
              help="Most items (sources or texts) decoded together, summed over merged requests; also the most "
                   "items one request may hold.")
@click.option("--batch-wait-ms", type=FiniteFloatRange(0, 10_000), default=0.0, show_default=True,
              help="How long a request may wait for company before its decode starts. 0: a batch is what waits "
                   "when the decoder is free (requests that arrive during a decode form the next one).")
@click.option("--max-body-bytes", type=IntRange(1024, 1 << 30), default=DEFAULT_MAX_BODY_BYTES,
              show_default=True, help="Largest request body accepted (413 beyond).")
@click.option("--request-timeout", type=FiniteFloatRange(0.1, 3600), default=DEFAULT_REQUEST_TIMEOUT_S,
              show_default=True, help="Seconds before a request is answered 408 instead of waiting on; its decode "
                                      "stops once no request of its batch waits.")
@click.option("--body-timeout", type=FiniteFloatRange(0.1, 3600), default=DEFAULT_BODY_TIMEOUT_S,
              show_default=True, help="Seconds a request's body may take to arrive after its headers: a body "
                                      "trickled in or cut short is answered 408 and its connection closed.")
@click.option("--proxy-location", type=click.Choice(PROXY_LOCATIONS), default="every-node", show_default=True,
              help="Ray Serve: where it runs HTTP proxies, every node (put a load balancer in front) or the head "
                   "only.")
@click.option("--max-decoding-length", type=IntRange(1, MAX_TARGET_LEN), default=DEFAULT_MAX_DECODING,
              show_default=True, help="Most output tokens (points: target_len) a request may ask for; the model's "
                                      "own length is always allowed.")
@click.option("--max-beam-size", type=IntRange(1, MAX_BEAM), default=DEFAULT_MAX_BEAM_SIZE,
              show_default=True,
              help="Token models: the widest beam (beam_size) a request may ask for; a decode holds texts x beam "
                   "rows of state. Refused for a point model.")
@click.option("--name", default=APP_NAME, show_default=True, callback=_name_option,
              help="Ray Serve: the application's name (one per model on a shared cluster).")
@click.option("--route-prefix", default="/", show_default=True, callback=_prefix_option,
              help="URL prefix of the routes, for several models behind one Serve.")
@click.option("--address", default=None, callback=address_option,
              help="Deploy onto an existing Ray cluster (ray start --head prints it); the model directory is "
                   "shipped to its nodes. Implies --ray. Default: start Ray on this machine (with --ray).")
@click.option("--ray", "use_ray", is_flag=True,
              help="Serve on Ray Serve (replicas, autoscaling, several machines) instead of in this process.")
@click.option("--max-queue", type=IntRange(1, MAX_QUEUE_LIMIT), default=DEFAULT_MAX_QUEUE, show_default=True,
              help="Most items (sources or texts) waiting for a decode, per process or replica; a request beyond "
                   "it is answered 503 with Retry-After at once.")
@click.option("--shutdown-timeout", type=FiniteFloatRange(0, 3600), default=None,
              help=f"On Ctrl-C or SIGTERM, how long stopping may take. In this process: the requests under way "
                   f"(default {DEFAULT_SHUTDOWN_TIMEOUT_S:g} s). On Ray: a start-up step under way, the requests "
                   f"under way (for all but {STOP_RESERVE_S:g} s of it), removing the deployment and stopping the "
                   f"Ray started here (default {DEFAULT_RAY_SHUTDOWN_TIMEOUT_S:g} s); past it (0: at once), or on a "
                   "second signal, the processes this command started are killed.")
@click.option("--allocator", default="auto", show_default=True,
              help="This process's C allocator (Linux): mimalloc (the serve extra installs it) makes onnxruntime's "
                   "many small allocations cheaper (the dates transformer over HTTP: ~5-12% more requests/s at "
                   "beam 5, ~1-4% greedy); system: the C library's malloc; or the path of a shared library to "
                   "preload (jemalloc ...). auto: mimalloc where installed. The program starts itself again with it "
                   "preloaded (same pid). An allocator your LD_PRELOAD set is kept. With --ray only auto or "
                   "system, which change nothing.")
@click.pass_context
def serve_command(ctx: click.Context, model_dir: Path, host: str, port: int, replicas: str, num_cpus: float,
                  provider: str, workers: int, max_batch_size: int, batch_wait_ms: float, max_body_bytes: int,
                  max_decoding_length: int, max_beam_size: int, request_timeout: float, body_timeout: float,
                  proxy_location: str, name: str, route_prefix: str, address: str | None, use_ray: bool, max_queue: int,
                  shutdown_timeout: float | None, allocator: str) -> None:
    """Serve the exported model in MODEL_DIR over HTTP, with dynamic batching: in this process by default, or on
    Ray Serve with --ray.

    POST /v1/predict (point models) or /v1/translate (token models); GET /v1/model, /healthz, /readyz, /metrics;
    /docs."""
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as a URL writes it (the ready line does)
        host = host[1:-1]
    use_ray = use_ray or address is not None or replicas != "1"
    _refuse_ray_only(ctx, use_ray)
    _check_copies(workers, num_cpus, _ray_because(ctx, use_ray, address, replicas))
    _refuse_beams_of_points(ctx, model_dir)
    malloc = _allocator(allocator, _ray_because(ctx, use_ray, address, replicas))  # before the heavy imports
    if use_ray:
        require(("fastapi", "ray.serve"), "Ray Serve and FastAPI", "serve", "serve --ray")
    else:
        require(("fastapi", "uvicorn", "prometheus_client"), "FastAPI, uvicorn and prometheus-client", "serve", "serve")
    if batch_wait_ms / 1000 >= request_timeout:  # ServeConfig says it too, in its own field names
        raise click.UsageError(f"--batch-wait-ms {batch_wait_ms:g} is not under --request-timeout "
                               f"({request_timeout:g} s): a request that finds no other to batch with would wait its "
                               "whole deadline; lower --batch-wait-ms or raise --request-timeout")
    try:  # options that contradict each other, before any work
        config = ServeConfig(provider=provider, num_cpus=num_cpus, max_batch_size=max_batch_size,
                             batch_wait_ms=batch_wait_ms, max_body_bytes=max_body_bytes,
                             max_decoding_length=max_decoding_length, max_beam_size=max_beam_size,
                             max_queue=max_queue,
                             request_timeout_s=request_timeout, body_timeout_s=body_timeout, workers=workers)
    except InputError as exc:
        raise click.UsageError(str(exc)) from None
    held = None
    if address is not None:
        check_reachable(address)
    elif use_ray:
        check_port_free(host, port)
    else:
        held = listen_on(host, port)
    kind = check_model(model_dir, provider)
    if use_ray:
        from .serve_ray import RayPlan, serve_on_ray

        serve_on_ray(RayPlan(model_dir, kind, host, port, name, route_prefix, proxy_location, address, replicas),
                     config, DEFAULT_RAY_SHUTDOWN_TIMEOUT_S if shutdown_timeout is None else shutdown_timeout)
    else:
        _serve_here(model_dir, kind, config, (host, port, held), route_prefix, malloc,
                    DEFAULT_SHUTDOWN_TIMEOUT_S if shutdown_timeout is None else shutdown_timeout)
    click.echo("serve: stopped", err=True)


def _allocator(allocator: str, ray: str | None) -> str:
    """The allocator this process serves with (cli.allocator; it may start the program again here). On Ray the
    replicas are Ray's processes: only --allocator auto or system, which leave this one as it is."""
    if ray is not None:
        if allocator not in ("auto", "system"):
            raise click.BadParameter(f"{allocator!r} with {ray}: Ray Serve's replicas are processes Ray starts, "
                                     "with its own allocator; drop --allocator", param_hint="'--allocator'")
        return SYSTEM
    from .signals import IN_PROGRAM

    return choose_allocator(allocator, program=bool(IN_PROGRAM))


def _ray_because(ctx: click.Context, use_ray: bool, address: str | None, replicas: str) -> str | None:
    """Why this command serves on Ray (the option that asks for it, as given), or None."""
    if ctx.get_parameter_source("use_ray") == ParameterSource.COMMANDLINE:
        return "--ray"
    if address is not None:
        return "--address (which implies --ray)"
    return f"--replicas {replicas} (which implies --ray)" if use_ray else None


def _check_copies(workers: int, num_cpus: float, ray: str | None) -> None:
    """--workers: copies in this process only (Ray's replicas are its copies); in this process, workers x the
    intra-op threads of --num-cpus within the CPUs it may use. On Ray, --num-cpus is what each replica reserves on
    whichever node runs it: not this machine's to check."""
    from runtime.defaults import max_threads

    if ray is not None:
        if workers > 1:
            raise click.UsageError(f"--workers {workers} holds copies of the model in this process; with {ray} every "
                                   "replica holds one: set how many with --replicas and drop --workers")
        return
    threads, cpus = max(1, math.floor(num_cpus)), max_threads()
    if workers * threads <= cpus:
        return
    if workers == 1:
        raise click.UsageError(f"--num-cpus {num_cpus:g}: {threads} decoding threads, more than the {cpus} CPUs this "
                               f"process may use; pass --num-cpus {cpus} or less (on Ray, --num-cpus is reserved "
                               "per replica)")
    given = f"--workers {workers}" + (f" --num-cpus {num_cpus:g}" if threads > 1 else "")
    each = "one decoding thread" if threads == 1 else f"{threads} decoding threads"
    raise click.UsageError(f"{given}: {workers} copies of {each} each need {workers * threads} CPUs, more than the "
                           f"{cpus} this process may use; pass --workers times the threads of --num-cpus (its whole "
                           f"part, at least 1) of {cpus} or less")


def _decoding(config: ServeConfig) -> str:
    """How this process decodes, for its ready line."""
    threads = f"{config.threads} decoding thread(s)"
    return threads if config.workers == 1 else f"{config.workers} copies of the model, {threads} each"


def _refuse_ray_only(ctx: click.Context, use_ray: bool) -> None:
    """Ray Serve's own options, given without Ray, are usage errors rather than silently ignored."""
    given = [name for name in RAY_ONLY if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE]
    if given and not use_ray:
        flag = "--" + given[0].replace("_", "-")
        raise click.BadParameter(f"is for Ray Serve; add --ray, or drop {flag}", ctx=ctx, param_hint=f"'{flag}'")


def _refuse_beams_of_points(ctx: click.Context, model_dir: Path) -> None:
    """--max-beam-size given for a point model, which decodes without beams, is a usage error, not ignored (read
    from the manifest before the port is taken; a manifest that cannot be read is the model check's to refuse)."""
    if ctx.get_parameter_source("max_beam_size") != ParameterSource.COMMANDLINE:
        return
    from runtime.manifest import read_manifest

    try:
        kind = read_manifest(model_dir).spec.kind
    except Seq2OnnxError:
        return
    if kind == "points":
        raise click.BadParameter(f"{model_dir} is a point model, which decodes without beams; drop --max-beam-size",
                                 ctx=ctx, param_hint="'--max-beam-size'")


def _serve_here(model_dir: Path, kind: str, config: ServeConfig, where: tuple[str, int, Any], prefix: str,
                malloc: str, shutdown_timeout: float) -> None:
    """The one-process server at `where` (host, port, the socket bound there) until Ctrl-C or SIGTERM, stopped
    gracefully."""
    host, port, held = where
    from serving.server import Listen, serve_forever

    route = prefix.rstrip("/") + ("/v1/predict" if kind == "points" else "/v1/translate")

    def ready(service: Any) -> None:
        under = prefix.rstrip("/")
        on = service.model.providers[0].removesuffix("ExecutionProvider")  # 'auto' says where it landed
        click.echo(f"serve: {model_dir} at http://{in_url(host)}:{port}{under} (POST {route}; GET {under}/v1/model, "
                   f"{under}/healthz, {under}/readyz, {under}/metrics; docs at {under}/docs); this process, "
                   f"{_decoding(config)} on {on}, {malloc}; Ctrl-C stops", err=True)

    stopped_by, service = serve_forever(model_dir, config, Listen(host, port, prefix, shutdown_timeout), ready, held)
    if stopped_by is None:
        raise click.ClickException(f"serve: the server at {in_url(host)}:{port} stopped by itself (see above)")
    answered, unanswered = service.metrics.totals()
    cut = (" (cut off by the shutdown, those still connected answered 503 to retry, or left by their client)"
           if unanswered else "")  # (seq2onnx_unanswered: the decode they asked for was not given)
    click.echo(f"serve: {answered} request(s) answered, {unanswered} not decoded{cut}", err=True)
