"""The ASGI app every backend serves: the FastAPI app of `serving.http`, with well-formed decode requests
answered in front of it, and a request that a shutdown cuts off answered in JSON."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError

from runtime import strict_json
from runtime.errors import Seq2OnnxError

from .answers import batch_headers, client_prefix, count, predict_body, refusal, translate_body
from .encode import json_bytes, size
from .gone import ClientGone, unless_gone
from .limits import BodyTimeout, compressed, read_body
from .schemas import TranslateRequest
from .service import service_of


class Front:
    """The ASGI app every backend serves: the FastAPI app, with well-formed decode requests answered in front of it.

    A POST to /v1/translate or /v1/predict with a JSON body of a declared length within the bound skips FastAPI's
    middleware and request machinery, which cost more than the rest of a one-text request (wrk, one connection, the
    dates model: 570 requests/s through the FastAPI route, 780 through a middleware inside it, more in front): the
    body is parsed with `json`, validated by the route's own pydantic model, decoded by the service, written as
    JSON, and counted in the metrics. What it answers is what the route would. Anything else, a malformed body
    included, goes to the FastAPI app, whose handlers word the refusal."""

    def __init__(self, app: FastAPI, routes: dict[str, Any]) -> None:
        self.app, self.routes = app, routes  # {path: the APIRoute it stands in for}

    @property
    def state(self) -> Any:
        return self.app.state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        responded = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal responded
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._answer(scope, receive, tracked)
        except asyncio.CancelledError:  # the server's shutdown cut it off (past --shutdown-timeout)
            if responded:
                raise
            # answered in JSON, not uvicorn's plain 500 and a traceback; it stays counted as ended without an answer
            with contextlib.suppress(Exception):  # the connection may be gone already
                await _send_json(send, 503, {"error": "this server is shutting down and stopped this request "
                                             "before it was answered (past serve --shutdown-timeout, or a second "
                                             "Ctrl-C); retry"},
                                 {"retry-after": "1", "connection": "close"})

    async def _answer(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = self.routes.get(route_path(scope)) if scope["method"] == "POST" else None
        service = service_of(self.app) if route is not None else None
        if route is not None and scope.get("query_string"):  # options there were ignored, and the call ran without
            status = await _send_json(send, 422, {"error": query_refused(scope, route.path)}, {"connection": "close"})
            if service is not None:
                count(service, route.path, status, time.perf_counter())
            return
        declared = dict(scope["headers"]).get(b"content-length", b"") if service is not None else b""
        if not declared.isdigit() or int(declared) > service.config.max_body_bytes or compressed(scope):
            return await self.app(scope, receive, send)  # the body limit and the route say what is wrong
        started = time.perf_counter()
        try:
            body = await read_body(receive, service.config.body_timeout_s)
        except ClientGone:  # gone before the whole body came: no request to answer
            count(service, route.path, None, started)
            return
        except BodyTimeout as late:
            await _send_json(send, 408, {"error": str(late)}, {"connection": "close"})
            count(service, route.path, 408, started)
            return
        except BaseException:  # cut off while its body came (a shutdown past its timeout): no answer
            count(service, route.path, None, started)
            raise
        model = route.body_field.field_info.annotation
        if len(body) > OFF_THE_LOOP_BYTES:  # parsed in a thread: the loop answers others (health probes) meanwhile
            request = await service.off_loop(_parsed, model, scope, body)
        else:
            request = _parsed(model, scope, body)
        if request is None:  # FastAPI's own validation says what is wrong, in its words (the JSON read once)
            return await self.app(scope, _replay(body, receive), send)
        try:
            if isinstance(request, TranslateRequest):
                done = await unless_gone(service.translate(request.texts, request.options()), receive, scope)
                status, payload = 200, translate_body(service, done, arrays=True)
                headers = batch_headers(service, done)
            else:
                done = await unless_gone(service.predict(request.source, request.source_mask, request.target_len,
                                                         request.return_attention),
                                         receive, scope)
                payload = predict_body(service, done, request.return_attention, arrays=True)
                status, headers = 200, batch_headers(service, done)
        except Seq2OnnxError as exc:
            status, payload, headers = refusal(exc, client_prefix(scope, self.app.state))
        except ClientGone:  # no one to answer: its decode was given up
            count(service, route.path, None, started)
            return
        except BaseException:  # cut off (shutdown past its timeout, the client gone): no answer
            count(service, route.path, None, started)
            raise
        try:  # a large answer is written a part at a time: a shutdown's cut may come while it is
            status = await _send_json(send, status, payload, headers)
        except BaseException:  # no whole answer went out (the front answers 503 where none had started)
            count(service, route.path, None, started)
            raise
        count(service, route.path, status, started)


def route_path(scope: dict[str, Any]) -> str:
    """The request's path as the app's routes see it (a mount's or Serve's prefix taken off)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def query_refused(scope: dict[str, Any], path: str) -> str:
    """What a decode request with a query string is told: its options go in the body (FastAPI ignores a query it
    does not declare, so `?beam_size=5` decoded greedily)."""
    query = scope["query_string"].decode("latin-1")
    shown = query if len(query) <= 80 else query[:80] + "..."
    example = '{"texts": [...], "beam_size": 5}' if path.endswith("/translate") else '{"source": [...], "target_len": 20}'
    return (f"POST {scope['path']}: the query string is not read (got {shown!r}); a decode's options go in the JSON "
            f"body beside its input, e.g. {example}")


def _replay(body: bytes, receive: Any) -> Any:
    replayed = False

    async def again() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


OFF_THE_LOOP_BYTES = 64 * 1024  # a body this large takes milliseconds to parse and check: done in a thread
PARSED = "seq2onnx.parsed"  # the scope's key for the body as JSON read here, which FastAPI's route then reuses


def _parsed(model: Any, scope: dict[str, Any], body: bytes) -> Any:
    """The validated request, or None when anything is unusual (FastAPI then handles it). JSON that parsed but did
    not validate is left in the scope, for the route to validate without reading the body again."""
    content_type = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
    if not body or not (content_type == b"application/json" or content_type.endswith(b"+json")):
        return None
    try:
        document = strict_json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError and JsonRefused are ValueErrors; FastAPI says
        return None
    try:
        return model.model_validate(document)
    except (ValueError, ValidationError, RecursionError):
        scope[PARSED] = document
        return None


ANSWER_TOO_LARGE = ("the answer (about {} numbers) needs more memory than this server has free now; ask for less "
                    "in one request (fewer or shorter inputs, without return_attention), or try again later")


async def _send_json(send: Any, status: int, payload: dict[str, Any], headers: dict[str, str]) -> int:
    """Send `payload` as JSON; returns the status sent. An answer that the memory left cannot hold as text is a 503
    saying so (it was a plain-text 500 and a traceback, and the request went uncounted)."""
    try:
        body = await json_bytes(payload)  # a large answer a part at a time: the loop answers others meanwhile
    except MemoryError:
        status, headers = 503, {}
        body = json.dumps({"error": ANSWER_TOO_LARGE.format(size(payload))}, separators=(",", ":")).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name.encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
    return status
