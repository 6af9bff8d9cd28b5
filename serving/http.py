"""The HTTP API, the same on every backend: a FastAPI app over one `Service` (`app.state.service`).

Routes: POST /v1/predict (points), POST /v1/translate (tokens), GET /v1/model, GET /healthz (alive), GET /readyz
(the model loaded and the queue not full), GET /metrics (Prometheus text); /docs shows the schemas. Refusals are
one line, `{"error": ...}`: 400 a bad request, 413 too large, 422 a malformed body, 408 not answered within the
request timeout, 503 (with Retry-After) the queue full. Every decode answer says how it was batched in
`x-seq2onnx-batch-requests` / `-rows` and which server answered in `x-seq2onnx-replica`. No Ray here."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import runtime
from runtime.errors import Seq2OnnxError, one_line

from .batching import Decoded, RequestTooLarge
from .limits import BodyLimit, describe_validation
from .metrics import CONTENT_TYPE
from .schemas import (
    ErrorBody,
    ModelInfo,
    PredictRequest,
    PredictResponse,
    TranslateRequest,
    TranslateResponse,
)
from .service import DeadlineExceeded, Overloaded, Service, service_of

REFUSALS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 408, 413, 422, 503)}
ROUTES = (("POST", "/v1/predict"), ("POST", "/v1/translate"), ("GET", "/v1/model"), ("GET", "/healthz"),
          ("GET", "/readyz"), ("GET", "/metrics"), ("GET", "/docs"))


def routes(prefix: str = "") -> str:
    """Every route, as a client spells it (under `prefix`)."""
    return ", ".join(f"{method} {prefix.rstrip('/')}{path}" for method, path in ROUTES)


def _tolist(array: Any) -> Any:
    return None if array is None else array.tolist()


def hypothesis(h: Any) -> dict[str, Any]:
    """A runtime Translation as a JSON-ready dict."""
    return {"text": h.text, "tokens": h.tokens, "ids": h.ids, "score": h.score, "log_prob": h.log_prob,
            "attention": _tolist(h.attention)}


def predict_body(service: Service, done: Decoded, return_attention: bool) -> dict[str, Any]:
    """The /v1/predict answer of a decoded request (its own error raised)."""
    if isinstance(done.value, Exception):
        raise done.value
    outputs, attention = done.value
    return {"outputs": outputs.tolist(), "attention": _tolist(attention) if return_attention else None,
            "export_id": service.model.manifest.export_id}


def translate_body(service: Service, done: Decoded) -> dict[str, Any]:
    """The /v1/translate answer of a decoded request (its own error raised)."""
    if isinstance(done.value, Exception):
        raise done.value
    return {"translations": [[hypothesis(h) for h in hyps] for hyps in done.value],
            "export_id": service.model.manifest.export_id}


def _reply(service: Service, body: dict[str, Any], done: Decoded) -> JSONResponse:
    return JSONResponse(body, headers=_batch_headers(service, done))


def _service(request: Request) -> Service:
    return service_of(request.app)


router = APIRouter()


@router.post("/v1/predict", response_model=PredictResponse, responses=REFUSALS)
async def http_predict(body: PredictRequest, request: Request) -> JSONResponse:
    """Point models: predict target_len points per source sequence."""
    service = _service(request)
    done = await service.predict(body.source, body.source_mask, body.target_len)
    return _reply(service, predict_body(service, done, body.return_attention), done)


@router.post("/v1/translate", response_model=TranslateResponse, responses=REFUSALS)
async def http_translate(body: TranslateRequest, request: Request) -> JSONResponse:
    """Token models: translate texts with greedy search, beam search or sampling."""
    service = _service(request)
    done = await service.translate(body.texts, body.options())
    return _reply(service, translate_body(service, done), done)


@router.get("/v1/model", response_model=ModelInfo)
async def info(request: Request) -> ModelInfo:
    """The model's spec, export id and vocabulary sizes; the providers and batching of this server."""
    service = _service(request)
    model, config = service.model, service.config
    sizes = {side: len(vocab) for side, vocab in model.vocabularies.items()} or None
    return ModelInfo(kind=model.spec.kind, spec=dataclasses.asdict(model.spec), export_id=model.manifest.export_id,
                     vocabulary_size=sizes, providers=model.providers, threads=config.threads,
                     max_batch_size=config.max_batch_size, batch_wait_ms=config.batch_wait_ms, replica=service.name,
                     node=service.node, version=runtime.__version__)


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, str]:
    """Liveness: 200 while this server answers at all."""
    return {"status": "ok", "replica": _service(request).name}


@router.get("/readyz", responses={503: {"model": ErrorBody}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when the model is loaded and the queue has room, else 503 (send traffic elsewhere)."""
    service = _service(request)
    if not service.ready:
        return JSONResponse({"error": "not ready: the queue is full"}, status_code=503)
    return JSONResponse({"status": "ready", "replica": service.name})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this server, in the text exposition format."""
    return Response(_service(request).metrics.text(), media_type=CONTENT_TYPE)


class Measured:
    """ASGI middleware: every HTTP request counted by route and status, and timed."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status, answered = time.perf_counter(), [500], [False]

        async def sent(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            answered[0] = message["type"] == "http.response.body" and not message.get("more_body", False)

        try:
            await self.app(scope, receive, sent)
        finally:
            service = service_of(scope.get("app"))
            route = getattr(scope.get("route"), "path", "other")  # the route's template: a bounded label set
            if service is not None:
                count(service, route, status[0] if answered[0] else None, started)


def count(service: Service, route: str, status: int | None, started: float) -> None:
    """One request in the metrics: answered with `status`, or (None) ended without an answer."""
    if status is None:
        service.metrics.unanswered.inc()
        return
    service.metrics.requests.labels(route, str(status)).inc()
    service.metrics.latency.labels(route).observe(time.perf_counter() - started)


def attach(app: Front, service: Service) -> Front:
    """Make `app` serve `service` (and bound its bodies by the service's max_body_bytes)."""
    app.state.service = service
    return app


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
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._answer(scope, receive, tracked)
        except asyncio.CancelledError:  # the server's shutdown cut it off (past --shutdown-timeout)
            if started:
                raise
            # answered in JSON, not uvicorn's plain 500 and a traceback; it stays counted as ended without an answer
            with contextlib.suppress(Exception):  # the connection may be gone already
                await _send_json(send, 503, {"error": "this server is shutting down and stopped this request "
                                             "before it was answered (serve --shutdown-timeout); retry"},
                                 {"retry-after": "1", "connection": "close"})

    async def _answer(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = self.routes.get(_route_path(scope)) if scope["method"] == "POST" else None
        service = service_of(self.app) if route is not None else None
        declared = dict(scope["headers"]).get(b"content-length", b"") if service is not None else b""
        if not declared.isdigit() or int(declared) > service.config.max_body_bytes:
            return await self.app(scope, receive, send)  # the body limit and the route say what is wrong
        started = time.perf_counter()
        body = await _read_body(receive)
        request = _parsed(route.body_field.field_info.annotation, scope, body)
        if request is None:  # FastAPI's own parsing and validation say what is wrong, in its words
            return await self.app(scope, _replay(body, receive), send)
        try:
            if isinstance(request, TranslateRequest):
                done = await service.translate(request.texts, request.options())
                status, payload, headers = 200, translate_body(service, done), _batch_headers(service, done)
            else:
                done = await service.predict(request.source, request.source_mask, request.target_len)
                payload = predict_body(service, done, request.return_attention)
                status, headers = 200, _batch_headers(service, done)
        except Seq2OnnxError as exc:
            status, payload, headers = refusal(exc)
        except BaseException:  # cut off (shutdown past its timeout, the client gone): no answer
            count(service, route.path, None, started)
            raise
        await _send_json(send, status, payload, headers)
        count(service, route.path, status, started)


def _route_path(scope: dict[str, Any]) -> str:
    """The request's path as the app's routes see it (a mount's or Serve's prefix taken off)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    replayed = False

    async def again() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def _parsed(model: Any, scope: dict[str, Any], body: bytes) -> Any:
    """The validated request, or None when anything is unusual (FastAPI then handles it)."""
    content_type = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
    if not body or not (content_type == b"application/json" or content_type.endswith(b"+json")):
        return None
    try:
        return model.model_validate(json.loads(body))
    except (ValueError, ValidationError):  # JSONDecodeError is a ValueError
        return None


def _batch_headers(service: Service, done: Decoded) -> dict[str, str]:
    return {"x-seq2onnx-batch-requests": str(done.batch_requests), "x-seq2onnx-batch-rows": str(done.batch_rows),
            "x-seq2onnx-replica": service.name}


async def _send_json(send: Any, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name.encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def create_app(prefix: str = "") -> Front:
    """A fresh app (routes under `prefix`), to `attach` a service to before it serves."""
    under = prefix.rstrip("/")
    app = FastAPI(title="seq2onnx", version=runtime.__version__, docs_url=f"{under}/docs",
                  openapi_url=f"{under}/openapi.json", redoc_url=f"{under}/redoc",
                  summary="Encoder-decoder models with attention, exported to ONNX")
    app.state.route_prefix = under
    app.include_router(router, prefix=under)
    app.add_middleware(BodyLimit)
    app.add_middleware(Measured)  # outermost: it sees the body limit's 413 too
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Seq2OnnxError, _refused)
    decode_routes = {prefix.rstrip("/") + route.path: route for route in router.routes
                     if route.path in ("/v1/translate", "/v1/predict")}
    return Front(app, decode_routes)


# a field of the other kind's route: the model's kind decides which route the client meant
OTHER_KIND = {"texts": ("tokens", "texts: this server's model is a token model, which takes texts; POST "
                                  '{"texts": [...]} to /v1/translate'),
              "source": ("points", "source: this server's model is a point model, which takes numeric sources; POST "
                                   '{"source": [[[x, y], ...]]} to /v1/predict')}


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    for error in errors:
        field_name = error.get("loc", ())[-1] if error.get("type") == "extra_forbidden" else None
        kind, message = OTHER_KIND.get(field_name, (None, ""))
        if kind is not None and (service := _service(request)) is not None and service.model.spec.kind == kind:
            return JSONResponse({"error": message}, status_code=400)  # as the reverse mistakes are answered
    return JSONResponse({"error": describe_validation(errors, request.headers.get("content-type"))}, status_code=422)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404, 405 and the like in the same shape as every other refusal."""
    under = request.scope.get("root_path", "") + getattr(request.app.state, "route_prefix", "")  # Ray's, ours
    return JSONResponse({"error": f"{request.method} {request.url.path}: {str(exc.detail).lower()}; the routes are "
                                  f"{routes(under)}"}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


def refusal(exc: Seq2OnnxError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) of a request refused by the runtime or the service."""
    if isinstance(exc, Overloaded):
        return 503, {"error": one_line(exc)}, {"retry-after": str(exc.retry_after_s)}
    status = 413 if isinstance(exc, RequestTooLarge) else 408 if isinstance(exc, DeadlineExceeded) else 400
    return status, {"error": one_line(exc)}, {}


async def _refused(request: Request, exc: Seq2OnnxError) -> JSONResponse:
    status, body, headers = refusal(exc)
    return JSONResponse(body, status_code=status, headers=headers)
