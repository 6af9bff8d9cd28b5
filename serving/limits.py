"""Request bounds and messages: a body-size limit enforced before the body is parsed, and pydantic's validation
errors turned into the house's one-line message."""
from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

from .config import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES
from .gone import GONE, ClientGone
from .service import service_of

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
BODY_METHODS = ("POST", "PUT", "PATCH")
DRAIN_BYTES = 64 << 20  # the largest refused body read (and dropped) so that a client sending it all reads its 413
DRAIN_TIMEOUT_S = 5.0  # and the longest such a read may take


class BodyLimit:
    """ASGI middleware: refuse a body over the served model's max_body_bytes with 413, by its Content-Length before
    reading, and by counting when it is streamed without one (raising inside receive() would reach the client as
    FastAPI's 400, so the body is read here first, bounded, and replayed)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        service = service_of(scope.get("app"))
        limit = service.config.max_body_bytes if service is not None else DEFAULT_MAX_BODY_BYTES
        timeout = service.config.body_timeout_s if service is not None else DEFAULT_BODY_TIMEOUT_S
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            drained = declared.isdigit() and await _drain(receive, int(declared), headers, timeout)
            return await _too_large(send, declared.decode("latin-1"), limit, close=not drained)
        encoding = compressed(scope)
        if encoding is not None and scope.get("method") in BODY_METHODS:  # read as JSON it would fail as such
            return await _refuse(send, 415, f"Content-Encoding {encoding!r}: this server reads only uncompressed "
                                            "bodies; send the JSON as it is")
        try:
            body = await read_body(receive, timeout, limit)  # FastAPI reads whole bodies anyway
        except ClientGone:  # before the whole body came: no answer, counted unanswered (Measured reads GONE)
            scope[GONE] = True
            return
        except BodyTimeout as late:
            return await _refuse(send, 408, str(late), close=True)
        if body is None:
            return await _too_large(send, f"more than {limit}", limit)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect message
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def compressed(scope: Scope) -> str | None:
    """The request's Content-Encoding where it is other than identity (every such header counted), else None."""
    codings = [coding.strip().lower() for name, value in scope.get("headers") or [] if name == b"content-encoding"
               for coding in value.decode("latin-1").split(",")]
    other = [coding for coding in codings if coding not in ("identity", "")]
    return ", ".join(other) if other else None


class BodyTimeout(Exception):
    """The request's body had not all come when its time (serve --body-timeout) ran out."""


async def read_body(receive: Receive, timeout_s: float, limit: int | None = None,
                    keep: bool = True) -> bytes | None:
    """The whole request body, or None as soon as it passes `limit` bytes; ClientGone if the client disconnects
    before its end (a part of a body is no request to answer), BodyTimeout if it has not ended within timeout_s (a
    body trickled in, or one shorter than its Content-Length, would hold its connection for as long as the client
    keeps it open). `keep=False` reads it to its end and drops it (b"" at the end)."""
    chunks: list[bytes] = []
    try:
        if hasattr(asyncio, "timeout"):  # Python 3.11+: no task of its own
            async with asyncio.timeout(timeout_s):
                return await _read(receive, chunks, limit, keep)
        return await asyncio.wait_for(_read(receive, chunks, limit, keep), timeout_s)
    except asyncio.TimeoutError:  # TimeoutError itself from 3.11
        size = sum(map(len, chunks))
        raise BodyTimeout(f"request body: {size} byte{'s' * (size != 1)} came in {timeout_s:g} s, and not its end "
                          "(serve --body-timeout); send the whole body at once") from None


async def _read(receive: Receive, chunks: list[bytes], limit: int | None, keep: bool = True) -> bytes | None:
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        body = message.get("body", b"")
        if keep:
            chunks.append(body)
        size += len(body)
        if limit is not None and size > limit:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _too_large(send: Send, given: str, limit: int, close: bool = False) -> None:
    await _refuse(send, 413, f"request body: at most {limit} bytes (serve --max-body-bytes), got {given} bytes; send "
                             "fewer items per request", close=close)


async def _drain(receive: Receive, declared: int, headers: dict[bytes, bytes], timeout_s: float) -> bool:
    """Read and drop a refused body of up to DRAIN_BYTES before answering, as a lingering close would: a client
    that sends its whole body before it reads (urllib, requests) would otherwise meet a reset connection instead of
    the answer, once the server closes with its body unread. Not for a client that waits for 100 Continue (curl,
    httpx on large bodies: it reads the 413 and sends nothing), nor past DRAIN_BYTES or timeout_s. Whether the
    whole body was read (the connection can then stay open)."""
    if declared > DRAIN_BYTES or headers.get(b"expect", b"").lower() == b"100-continue":
        return False
    try:
        return await read_body(receive, min(timeout_s, DRAIN_TIMEOUT_S), DRAIN_BYTES, keep=False) is not None
    except (ClientGone, BodyTimeout):
        return False


async def _refuse(send: Send, status: int, error: str, close: bool = False) -> None:
    body = json.dumps({"error": error}, separators=(",", ":")).encode()  # compact, as JSONResponse writes it
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + [(b"connection", b"close")] * close})
    await send({"type": "http.response.body", "body": body})


def _place(loc: Any) -> str:
    """pydantic's loc ('body', 'texts', 0) as the runtime's messages name places: texts[0], options.beam_size."""
    place = ""
    for part in loc:
        if part == "body" and not place:
            continue
        place += f"[{part}]" if isinstance(part, int) else f".{part}" if place else str(part)
    return place or "body"


def describe_validation(errors: list[dict[str, Any]], content_type: str | None = None) -> str:
    """pydantic errors -> one line: each failing field's place, the problem and the value given (first three);
    `content_type`: the request's, named when the body was not taken as JSON."""
    parts = []
    for error in errors[:3]:
        if error.get("type") == "json_invalid":  # loc is ("body", character offset)
            reason = (error.get("ctx") or {}).get("error", "malformed")
            parts.append(f"body: not valid JSON ({reason}; character {error.get('loc', ('', '?'))[-1]})")
            continue
        place = _place(error.get("loc", ()))
        given = error.get("input")
        if place == "body" and error.get("type") == "missing":  # no body at all
            parts.append("body: expected a JSON object (the route's schema: /docs), got an empty body")
            continue
        if place == "body" and isinstance(given, (bytes, str)) and not _json_type(content_type):  # not parsed
            parts.append("body: expected a JSON object sent as Content-Type: application/json, got "
                         + (f"Content-Type: {_short(content_type)}" if content_type else "no Content-Type"))
            continue
        shown = "" if error.get("type") == "missing" else f", got {_short(given)}"
        parts.append(f"{place}: {error.get('msg', 'invalid').lower()}{shown}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def _json_type(content_type: str | None) -> bool:
    """Whether FastAPI read a body of this Content-Type as JSON (then a str given is a JSON string, not the body)."""
    main = (content_type or "").split(";")[0].strip().lower()
    return main == "application/json" or main.endswith("+json")


def _short(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # bytes of a body that is not JSON, or an object pydantic kept
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
