"""Joining a Ray cluster from the command line: fail fast where nothing answers, and say what usually goes wrong."""
from __future__ import annotations

import os
import socket
from typing import Any

import click

from .common import ORT_TELEMETRY

CONNECT_TIMEOUT_S = 10  # a cluster's GCS port that does not accept a TCP connection in this long is not there
ANSWER_TIMEOUT_S = 5  # nor one that does not answer HTTP/2's preface in this long (a Ray head: milliseconds)
AUTH_HINT = ("a cluster started with Ray's token authentication (the default since Ray 2.5x) also needs "
             "RAY_AUTH_MODE=token here and its token (the head's ~/.ray/auth_token copied to this machine, or "
             "RAY_AUTH_TOKEN set to it)")


# HTTP/2's client connection preface and an empty SETTINGS frame: a gRPC server (a Ray head's GCS port) answers
# with a SETTINGS frame of its own (frame type 4 in the 9-byte frame header)
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
H2_SETTINGS = 4
TLS_ON = ("1", "true")  # RAY_USE_TLS: the GCS port then speaks TLS first, and the probe cannot tell


def check_reachable(address: str) -> None:
    """A HOST:PORT that nothing answers on is refused at once (ray.init would retry it for minutes), and so is one
    where something answers that does not speak gRPC, as a Ray head's GCS port does: ray.init retried an HTTP
    server's port (the dashboard's 8265, a web server) without end."""
    if address == "auto" or "://" in address:
        return  # Ray resolves and reports these itself; the rest is HOST:PORT (cli.options.address_option)
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in TLS_ON:
                return
            conn.sendall(H2_PREFACE)
            conn.settimeout(ANSWER_TIMEOUT_S)
            header = _read_some(conn, 9)
    except socket.gaierror as exc:  # a name (or a bracketed host) that does not resolve: as serve --host says it
        raise click.UsageError(f"--address {address}: {host!r} is not an address or a name this machine can resolve "
                               f"({exc.strerror})") from None
    except OSError as exc:
        raise click.ClickException(f"--address {address}: nothing answers there ({exc.strerror or exc}); start the "
                                   "cluster (ray start --head), or drop --address to start a local Ray") from None
    if len(header) < 9 or header[3] != H2_SETTINGS:
        heard = f"it answered {header[:16]!r}" if header else "it answered nothing"
        raise click.ClickException(f"--address {address}: something answers there, but not a Ray cluster's head "
                                   f"(that port speaks gRPC; {heard}); pass the address `ray start --head` printed "
                                   "(port 6379 by default: 8265 is the dashboard's, and 10001 the Ray Client "
                                   "server's, which takes ray://HOST:10001)")


def _read_some(conn: socket.socket, size: int) -> bytes:
    """Up to `size` bytes, fewer where the peer closes, stops sending for ANSWER_TIMEOUT_S or resets."""
    data = b""
    try:
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:  # a timeout or a reset: what came so far
        pass
    return data


NO_LOCAL_CLUSTER = "Could not find any running Ray instance"  # ray.init(address="auto") where none runs here


def join_failed(address: str, reason: str) -> click.ClickException:
    """The error for a cluster that answers but could not be joined; for `auto` where no cluster runs on this
    machine, that (the token hint is beside the point there)."""
    if address == "auto" and NO_LOCAL_CLUSTER in reason:
        return click.ClickException("--address auto: no Ray cluster runs on this machine to join; start one (ray "
                                    "start --head), pass a head's HOST:PORT, or drop --address to start a local Ray")
    return click.ClickException(f"--address {address}: could not join the Ray cluster there ({reason}); {AUTH_HINT}")


def runtime_env(working_dir: str | None) -> dict[str, Any]:
    """What a job of this command takes to a cluster: the model directory as its working directory (Ray uploads it
    to every node that runs a replica or an actor), and the program's onnxruntime telemetry choice, which processes
    started by the cluster's own raylets would not inherit from this one."""
    env = {ORT_TELEMETRY: os.environ[ORT_TELEMETRY]} if ORT_TELEMETRY in os.environ else {}
    return {"env_vars": env} | ({"working_dir": working_dir} if working_dir else {})
