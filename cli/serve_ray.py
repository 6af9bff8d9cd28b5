"""`seq2onnx serve --ray`: deploy the model on Ray Serve (a local Ray, or a cluster's with --address) and serve
until Ctrl-C or SIGTERM. The same HTTP app and service as the one-process server run in every replica."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from serving.config import Replicas, ServeConfig, parse_replicas

from .cluster import join_failed, runtime_env
from .ray_shutdown import leave_ray
from .ray_stop import Stop, drive, keep_group_signals_from_ray, local_ray_failed
from .signals import stop_for

PROXY_LOCATIONS = {"head": "HeadOnly", "every-node": "EveryNode"}
SERVE_TIMEOUT_MARGIN_S = 1.0  # Serve's own timeout is this much past the service's: the service answers 408 first
# Of --shutdown-timeout, what is kept for stopping Serve and the Ray started here after the replicas drained (2-3.4 s
# here since cli.ray_shutdown, more on a loaded machine; 15 s when it took 7-8): the replicas may finish the requests
# under way for the rest
STOP_RESERVE_S = 8.0
# Said as the first signal is taken while it starts: the step under way ends first (ray.init takes 3 s here, the
# deploy 4.5 s, more on a loaded machine); once it serves, the Ray thread says "serve: stopping" instead
STOPPING_LINE = ("serve: stopping once the step under way ends (starting Ray, Serve or the replicas); a second signal "
                 "kills what had started now")
JOINED_STOPPING_LINE = ("serve: stopping once the step under way ends (joining the cluster, starting Serve or the "
                        "replicas); a second signal exits now")


@dataclass(frozen=True)
class RayPlan:
    """Where and how the application runs on Ray."""

    model_dir: Path
    kind: str
    host: str
    port: int
    name: str
    route_prefix: str
    proxy_location: str
    address: str | None
    replicas: str  # N, MIN:MAX or auto: resolved once Ray runs


def in_url(host: str) -> str:
    """`host` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def serve_on_ray(plan: RayPlan, config: ServeConfig, shutdown_timeout_s: float) -> None:
    """Start (or join) Ray, deploy, serve until SIGTERM or Ctrl-C, then remove what was deployed. Ray is driven from a
    thread of its own (`cli.ray_stop`): a signal stops it between steps, never inside one."""
    note = "" if plan.address is None else (f"; the application {plan.name!r} may still run on the cluster at "
                                            f"{plan.address} (serve.delete({plan.name!r}) removes it)")
    served: list[bool] = []
    drain_s = max(0.0, shutdown_timeout_s - STOP_RESERVE_S)
    if drain_s == 0 < shutdown_timeout_s:  # 0: kill at once, said in its help
        click.echo(f"serve: note: --shutdown-timeout {shutdown_timeout_s:g} leaves the replicas no time to finish the "
                   f"requests under way when it stops (stopping Serve and Ray takes up to {STOP_RESERVE_S:g} s of it)",
                   err=True)
    on_stop = STOPPING_LINE if plan.address is None else JOINED_STOPPING_LINE
    signum = drive(lambda stop: served.append(_serve(plan, config, drain_s, stop)), shutdown_timeout_s, "serve",
                   "--shutdown-timeout ", note, on_stop)
    if signum is not None and not served[0]:
        stop = stop_for(signum)
        raise stop(f"serve: {stop.says} while starting; what had started is stopped")


def _serve(plan: RayPlan, config: ServeConfig, drain_s: float, stop: Stop) -> bool:
    """The Ray thread: start, deploy, serve until asked to stop, stop (the replicas finish the requests under way
    for up to `drain_s`). True when it served (it was ready)."""
    import ray
    from ray import serve

    started, deployed = plan.address is None, False
    try:
        _start_ray(plan.address, plan.model_dir)
        stop.connected.set()
        if stop.requested.is_set():
            return False
        config = dataclasses.replace(config, replicas=_resolve_replicas(plan.replicas, config.num_cpus))
        if started:
            _check_cpus(config.num_cpus, config.replicas.low, plan.replicas)
        url = _http_url(serve.status(), plan.name, plan.host, plan.port)
        if stop.requested.is_set():
            return False
        http = {"host": plan.host, "port": plan.port,
                "request_timeout_s": config.request_timeout_s + SERVE_TIMEOUT_MARGIN_S}
        serve.start(http_options=http, proxy_location=PROXY_LOCATIONS[plan.proxy_location])  # Serve's HTTP proxy
        if stop.requested.is_set():  # a signal while Serve started: no deploy (it went on to serve.run, 3 s more)
            return False
        deployed = True  # from here on, what is on the cluster under `name` is ours to remove
        _deploy(plan, config, drain_s)  # once deployed it answers (Serve's proxy routes to the replica
        # before serve.run returns): a stop from here on is a served run's graceful stop, exit 0, ready line first
        under = plan.route_prefix.rstrip("/")
        route = under + ("/v1/predict" if plan.kind == "points" else "/v1/translate")
        click.echo(f"serve: {plan.model_dir} at {url}{under} (POST {route}; GET {under}/v1/model, {under}/healthz, "
                   f"{under}/readyz, {under}/metrics; docs at {under}/docs); Ray Serve, {_describe(config.replicas)} of "
                   f"{config.num_cpus:g} CPU each; Ray at {ray.get_runtime_context().gcs_address}; Ctrl-C stops",
                   err=True)
        stop.serves.set()
        stop.requested.wait()
        stop.say_stopping("serve: stopping")
        return True
    finally:
        stop.stopping.set()
        if deployed:
            _stop(plan.name, on_cluster=not started)
        if started:
            leave_ray()


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
    return f"http://{in_url(host)}:{port}"


def _start_ray(address: str | None, model_dir: Path) -> bool:
    """Connect to the cluster at `address`, shipping the model directory as this job's working directory (Ray
    uploads it, and every replica starts in its own copy on whatever node), or start a local Ray; True when this
    process started it."""
    import ray

    try:
        if address is None:
            keep_group_signals_from_ray()
            ray.init(address="local", include_dashboard=False)  # never attach to a Ray someone else runs here
        else:
            ray.init(address=address, runtime_env=runtime_env(str(model_dir.resolve())))
    except (ConnectionError, ValueError, RuntimeError, OSError) as exc:
        if address is None:
            raise local_ray_failed("serve", exc, _first_line(exc)) from None
        raise join_failed(address, _first_line(exc)) from None
    return address is None


def _check_cpus(num_cpus: float, replicas: int, given: str) -> None:
    """The replicas (at least `replicas`, of `num_cpus` each; `given`: --replicas as typed) must fit the Ray started
    here: Serve would wait for CPUs that never come."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 0.0)
    if num_cpus > cpus:
        raise click.UsageError(f"--num-cpus {num_cpus:g}: each replica reserves that many CPUs, more than the {cpus:g} "
                               f"of the Ray started on this machine; pass --num-cpus {cpus:g} or less, or --address "
                               "of a cluster with larger nodes")
    if replicas * num_cpus > cpus:
        least = "" if given == str(replicas) else f" (at least {replicas})"
        raise click.UsageError(f"--replicas {given}{least} of --num-cpus {num_cpus:g}: they reserve "
                               f"{replicas * num_cpus:g} CPUs, more than the {cpus:g} of the Ray started on this "
                               "machine; pass fewer replicas or a smaller --num-cpus (--replicas auto fits them), or "
                               "--address of a larger cluster")


def _resolve_replicas(text: str, num_cpus: float) -> Replicas:
    import ray

    return parse_replicas(text, ray.cluster_resources().get("CPU"), num_cpus)


def _deploy(plan: RayPlan, config: ServeConfig, drain_s: float) -> None:
    """Run the application on Serve; a replica that cannot start fails the command."""
    from ray import serve

    from serving.app import build_app

    app = build_app(None if plan.address is not None else plan.model_dir, config, drain_s)  # None: replicas' workdir
    try:
        serve.run(app, name=plan.name, route_prefix=plan.route_prefix)
    except Exception as exc:  # Serve raises its own types for a deployment that failed to start
        raise click.ClickException(f"serve: the deployment failed to start: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def _describe(replicas: Replicas) -> str:
    return (f"{replicas.low} replica{'s' if replicas.low > 1 else ''}" if replicas.fixed
            else f"{replicas.low} to {replicas.high} replicas (autoscaling)")


def _stop(name: str, on_cluster: bool) -> None:
    """Remove what this command deployed: its application, whose replicas finish the requests under way while
    Serve's proxy still passes their answers on. On its own Ray the rest of Serve (controller, proxy) goes with Ray
    (leave_ray): serve.shutdown there cost ~0.4 s, and its controller, killed under its own graceful_shutdown task,
    had the raylet print "Task ServeController.graceful_shutdown failed ... will be retried" at every clean stop."""
    from ray import serve

    try:
        serve.delete(name)
    except Exception as exc:
        if not on_cluster:  # on its own Ray (stopped while Serve started, say), what is left goes with Ray
            return
        # stopping must not hide why we stop; say what could not be cleaned
        click.echo(f"serve: note: could not stop Serve cleanly ({_first_line(exc)})", err=True)
