"""Where `serve` listens: the port taken before the model loads, or checked free before Ray starts."""
from __future__ import annotations

import errno
import socket

import click

from .serve_ray import in_url

LISTEN_BACKLOG = 2048  # uvicorn's own


def check_port_free(host: str, port: int) -> None:
    """Refuse a port another process holds, before Ray starts (Serve would only log the failure)."""
    listen_on(host, port).close()


def listen_on(host: str, port: int) -> socket.socket:
    """The one-process server's socket, bound before the model loads: from here the port is this process's (a second
    server started a moment later was refused by uvicorn's bind, exit 3, after loading the model)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:  # (a subclass of OSError, said apart: a malformed or unknown name is usage)
        raise click.BadParameter(f"{host}: not an address or a name this machine can resolve ({exc.strerror}); "
                                 "use an address of this machine such as 127.0.0.1 or ::1", param_hint="--host"
                                 ) from None
    family, address = found[0][0], found[0][4]  # IPv4 or IPv6, as the name resolves first
    try:
        return socket.create_server(address[:2], family=family, backlog=LISTEN_BACKLOG)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(f"--port {port}: {in_url(host)}:{port} is already in use; stop what holds it or "
                                       "pick another --port") from None
        raise click.ClickException(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); "
                                   "use an address of this machine such as 127.0.0.1") from None
