"""The options of `seq2onnx train --nproc-per-node N` (PyTorch's launcher: processes, machines, rendezvous,
restarts), and their checks, made in one process before anything starts (`cli.launch` starts the run). Only click
and the stdlib at module level, so `--help` works without torch."""
from __future__ import annotations

import os
import re
from typing import Any

import click

from .options import IntRange, within_cpus
from .train_options import as_given, flag

LAUNCH_OPTIONS = ("nproc_per_node", "nnodes", "rdzv_endpoint", "rdzv_id", "rdzv_timeout", "max_restarts")
MULTI_NODE_OPTIONS = ("rdzv_endpoint", "rdzv_id", "rdzv_timeout")  # meaningful with --nnodes > 1 only
MAX_RESTARTS = 100
RDZV_BACKEND = "c10d"
DEFAULT_RDZV_PORT = 29400  # torchrun's default for c10d endpoints given without a port
DEFAULT_RDZV_TIMEOUT_S = 600  # torchrun's join_timeout: how long the machines wait for each other
MAX_RDZV_TIMEOUT_S = 24 * 3600
MAX_NODES = 1024
ENDPOINT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d{1,5}))?$")
RDZV_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def check_endpoint(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--rdzv-endpoint: HOST or HOST:PORT (port 1..65535)."""
    if value is None:
        return None
    match = ENDPOINT.match(value)
    port = match and match.group("port")
    if not match or (port is not None and not 1 <= int(port) <= 65535):
        raise click.BadParameter(f"expected HOST or HOST:PORT (port 1..65535) of the machine that hosts the "
                                 f"rendezvous, e.g. node0.example:{DEFAULT_RDZV_PORT}; got {value!r}")
    return value


def check_rdzv_id(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--rdzv-id: letters, digits, '.', '_' and '-'."""
    if value is not None and not RDZV_ID.match(value):
        raise click.BadParameter(f"expected 1-128 letters, digits, '.', '_' or '-' (the same on every node), "
                                 f"got {value!r}")
    return value


def check_nproc(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """--nproc-per-node: 1 up to this machine's usable CPUs (each process needs a core of its own)."""
    return within_cpus(value, "the CPUs this machine lets this process use; each training process needs at least one")


def launch_options(command: Any) -> Any:
    """Decorate `train` with the launcher's options."""
    for decorator in reversed((
        click.option("--nproc-per-node", type=int, default=None, callback=check_nproc,
                     help="Train on this many processes of this machine, 1 to its usable CPUs "
                          "(DistributedDataParallel over gloo), started through torch.distributed.run (torchrun). "
                          "--batch-size is per process: the "
                          "global batch is batch size x processes x nodes. Each process gets --threads threads "
                          "(default: usable CPUs / processes)."),
        click.option("--nnodes", type=IntRange(1, MAX_NODES), default=None,
                     help="With --nproc-per-node: the number of machines; run the same command on each of them, "
                          "with --rdzv-endpoint.  [default: 1]"),
        click.option("--rdzv-endpoint", default=None, callback=check_endpoint,
                     help=f"With --nnodes > 1: HOST[:PORT] of one of the machines, where the {RDZV_BACKEND} "
                          f"rendezvous listens (port default {DEFAULT_RDZV_PORT}); the same on every machine."),
        click.option("--rdzv-id", default=None, callback=check_rdzv_id,
                     help="With --nnodes > 1: a name for this job, the same on every machine, so two jobs on one "
                          "endpoint do not mix.  [default: torchrun's 'none', which every job given no name shares]"),
        click.option("--rdzv-timeout", type=IntRange(1, MAX_RDZV_TIMEOUT_S), default=None,
                     help="With --nnodes > 1: seconds to wait for every machine to join before giving up "
                          f"(torchrun's join_timeout).  [default: {DEFAULT_RDZV_TIMEOUT_S}]"),
        click.option("--max-restarts", type=IntRange(0, MAX_RESTARTS), default=None,
                     help="With --nproc-per-node: when a process fails, start them all again (up to this many "
                          "times) and resume from the last saved state.  [default: 0]"),
    )):
        command = decorator(command)
    return command


def check_launch(ctx: click.Context, launch: dict[str, Any], under_torchrun: bool, threads: int | None = None) -> bool:
    """True when this command is to start the processes itself; refuses launcher options that do not fit, and
    more threads in all than this machine's usable CPUs."""
    if launch["nproc_per_node"] is None:
        extra = [name for name in LAUNCH_OPTIONS[1:] if launch[name] is not None]
        if extra:
            raise click.BadParameter(f"{as_given(ctx, extra[0])} takes effect only with --nproc-per-node N (the "
                                     "processes per machine); add it", ctx=ctx, param_hint=flag(extra[0]))
        return False
    if under_torchrun:
        raise click.BadParameter(f"this process was started by torchrun already (rank {os.environ.get('RANK')} of "
                                 f"{os.environ.get('WORLD_SIZE')}); drop --nproc-per-node and give torchrun its "
                                 "process count", ctx=ctx, param_hint="'--nproc-per-node'")
    from runtime.sessions import max_threads

    nproc, cpus = launch["nproc_per_node"], max_threads()
    if threads is not None and threads * nproc > cpus:
        raise click.BadParameter(f"{threads} threads x {nproc} processes = {threads * nproc} threads on {cpus} usable "
                                 "CPUs: oversubscribed processes wait on each other at every all-reduce (measured "
                                 f"several times slower); expected at most {max(1, cpus // nproc)}, or leave it out",
                                 ctx=ctx, param_hint="'--threads'")
    nodes = launch["nnodes"] or 1
    if nodes > 1 and launch["rdzv_endpoint"] is None:
        raise click.BadParameter(f"{nodes} machines meet at a rendezvous; pass --rdzv-endpoint HOST[:PORT] of one of "
                                 "them, the same on every machine", ctx=ctx, param_hint="'--nnodes'")
    if nodes == 1:
        given = [name for name in MULTI_NODE_OPTIONS if launch[name] is not None]
        if given:
            raise click.BadParameter(f"{as_given(ctx, given[0])} is for a run on several machines; pass --nnodes N "
                                     "(N > 1) too, or drop it to train on this machine alone", ctx=ctx,
                                     param_hint=flag(given[0]))
        return True
    _check_resolvable(ctx, launch["rdzv_endpoint"])
    return True


def _split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of a checked HOST[:PORT] (IPv6 brackets removed)."""
    match = ENDPOINT.match(endpoint)
    assert match is not None  # checked by check_endpoint
    port = match.group("port")
    return match.group("host").strip("[]"), int(port) if port else DEFAULT_RDZV_PORT


def _check_resolvable(ctx: click.Context, endpoint: str) -> None:
    """The rendezvous host must have an address: a misspelt name is refused now, not after minutes of retries."""
    import socket

    host, port = _split_endpoint(endpoint)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise click.BadParameter(f"host {host!r} has no address this machine can find ({err}); expected the name or "
                                 "address of the machine hosting the rendezvous", ctx=ctx,
                                 param_hint="'--rdzv-endpoint'") from None
