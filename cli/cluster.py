"""Joining a Ray cluster from the command line: fail fast where nothing answers, and say what usually goes wrong."""
from __future__ import annotations

import os
import socket
from typing import Any

import click

from .common import ORT_TELEMETRY

CONNECT_TIMEOUT_S = 10  # a cluster's GCS port that does not accept a TCP connection in this long is not there
AUTH_HINT = ("a cluster started with Ray's token authentication (the default since Ray 2.5x) also needs "
             "RAY_AUTH_MODE=token here and its token (the head's ~/.ray/auth_token copied to this machine, or "
             "RAY_AUTH_TOKEN set to it)")


def check_reachable(address: str) -> None:
    """A HOST:PORT that nothing answers on is refused at once (ray.init would retry it for minutes)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not (port.isascii() and port.isdigit()):
        return  # 'auto', 'ray://...': Ray resolves and reports these itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise click.ClickException(f"--address {address}: nothing answers there ({exc.strerror or exc}); start the "
                                   "cluster (ray start --head), or drop --address to start a local Ray") from None


def join_failed(address: str, reason: str) -> click.ClickException:
    """The error for a cluster that answers but could not be joined."""
    return click.ClickException(f"--address {address}: could not join the Ray cluster there ({reason}); {AUTH_HINT}")


def runtime_env(working_dir: str | None) -> dict[str, Any]:
    """What a job of this command takes to a cluster: the model directory as its working directory (Ray uploads it
    to every node that runs a replica or an actor), and the program's onnxruntime telemetry choice, which processes
    started by the cluster's own raylets would not inherit from this one."""
    env = {ORT_TELEMETRY: os.environ[ORT_TELEMETRY]} if ORT_TELEMETRY in os.environ else {}
    return {"env_vars": env} | ({"working_dir": working_dir} if working_dir else {})
