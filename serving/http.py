"""The HTTP API, the same on every backend: a FastAPI app over one `Service` (`app.state.service`).

Routes: POST /v1/predict (points), POST /v1/translate (tokens), GET /v1/model, GET /healthz (alive), GET /readyz
(the model loaded and the queue not full), GET /metrics (Prometheus text); /docs shows the schemas. Refusals are
one line, `{"error": ...}`: 400 a bad request, 413 too large, 415 a compressed body, 422 a malformed body, 408 not
answered within the request timeout, 503 (with Retry-After) the queue full. Every decode answer says how it was
batched in `x-seq2onnx-batch-requests` / `-rows` and which server answered in `x-seq2onnx-replica`. `create_app` returns it
inside `serving.front.Front`, which answers well-formed decode requests itself; both answer through
`serving.answers`. No Ray here."""
from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

import runtime
from runtime import strict_json
from runtime.errors import Seq2OnnxError, one_line

from .answers import batch_headers, client_prefix, count, predict_body, refusal, translate_body
from .batching import Decoded
from .front import PARSED, Front, route_path
from .gone import GONE, ClientGone, unless_gone
from .jobs import TAKES, WrongKind, length_bound
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
from .service import Service, service_of

REFUSALS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 408, 413, 415, 422, 503)}
ROUTES = (("POST", "/v1/predict"), ("POST", "/v1/translate"), ("GET", "/v1/model"), ("GET", "/healthz"),
          ("GET", "/readyz"), ("GET", "/metrics"), ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json"))


def routes(prefix: str = "", kind: str | None = None) -> str:
    """Every route, as a client spells it (under `prefix`): with `kind`, the POST route of that kind of model only
    (the other answers 400, pointing here); every GET route takes HEAD too."""
    return ", ".join(f"{'GET/HEAD' if method == 'GET' else method} {prefix.rstrip('/')}{path}"
                     for method, path in ROUTES if kind is None or method != "POST" or path == TAKES[kind][2])


def _reply(service: Service, body: dict[str, Any], done: Decoded) -> JSONResponse:
    return JSONResponse(body, headers=batch_headers(service, done))


def _service(request: Request) -> Service:
    return service_of(request.app)


class _StrictJsonRequest(Request):
    """A request whose JSON body is read by `runtime.strict_json` (a repeated key or 1e400 refused, as `infer`
    refuses them), not by json.loads, which keeps the last key and reads 1e400 as infinity."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            if PARSED in self.scope:  # read by the front already (`serving.front`), maybe in a thread
                self._json = self.scope.pop(PARSED)
            else:
                self._json = strict_json.loads(await self.body())
        return self._json


class _StrictJsonRoute(APIRoute):
    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJsonRequest(request.scope, request.receive))

        return strict


router = APIRouter(route_class=_StrictJsonRoute, redirect_slashes=False)  # /v1/translate/ is a 404 that lists the routes


@router.post("/v1/predict", response_model=PredictResponse, responses=REFUSALS)
async def http_predict(body: PredictRequest, request: Request) -> JSONResponse:
    """Point models: predict target_len points per source sequence."""
    service = _service(request)
    try:
        done = await unless_gone(service.predict(body.source, body.source_mask, body.target_len, body.return_attention), request.receive,
                                 request.scope)
    except ClientGone:  # counted unanswered by Measured; the reply reaches no one
        return JSONResponse({}, status_code=499)
    return _reply(service, predict_body(service, done, body.return_attention), done)


@router.post("/v1/translate", response_model=TranslateResponse, responses=REFUSALS)
async def http_translate(body: TranslateRequest, request: Request) -> JSONResponse:
    """Token models: translate texts with greedy search, beam search or sampling."""
    service = _service(request)
    try:
        done = await unless_gone(service.translate(body.texts, body.options()), request.receive, request.scope)
    except ClientGone:  # counted unanswered by Measured; the reply reaches no one
        return JSONResponse({}, status_code=499)
    return _reply(service, translate_body(service, done), done)


@router.head("/v1/model", include_in_schema=False)  # every GET route takes HEAD too, as /docs does
@router.get("/v1/model", response_model=ModelInfo)
async def info(request: Request) -> ModelInfo:
    """The model's spec, export id and vocabulary sizes; the providers and batching of this server."""
    service = _service(request)
    model, config = service.model, service.config
    sizes = {side: len(vocab) for side, vocab in model.vocabularies.items()} or None
    return ModelInfo(kind=model.spec.kind, spec=model.spec.described(), export_id=model.manifest.export_id,
                     precision=model.manifest.precision, vocabulary_size=sizes, providers=model.providers,
                     threads=config.threads, workers=len(service.copies.models),
                     max_batch_size=config.max_batch_size, batch_wait_ms=config.batch_wait_ms,
                     max_decoding_length=length_bound(model, config.max_decoding_length),
                     max_beam_size=config.max_beam_size if model.spec.kind == "tokens" else None,
                     replica=service.name, node=service.node, version=runtime.__version__)


@router.head("/healthz", include_in_schema=False)  # HEAD: probes that want no body (one route of each method: the
@router.get("/healthz")  # schema gave GET and HEAD one operation id, and FastAPI warned of it on the first /docs)
async def healthz(request: Request) -> dict[str, str]:
    """Liveness: 200 while this server answers at all."""
    return {"status": "ok", "replica": _service(request).name}


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", responses={503: {"model": ErrorBody}})
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when the model is loaded and the queue has room, else 503 (send traffic elsewhere)."""
    service = _service(request)
    if not service.ready:
        return JSONResponse({"error": "not ready: the queue is full"}, status_code=503)
    return JSONResponse({"status": "ready", "replica": service.name})


@router.head("/metrics", include_in_schema=False)
@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this server, in the text exposition format."""
    return Response(_service(request).metrics.text(), media_type=CONTENT_TYPE)


class Measured:
    """ASGI middleware: every HTTP request counted by route and status, and timed."""

    def __init__(self, app: Any, prefix: str = "") -> None:
        self.app, self.prefix = app, prefix  # the app's routes are under prefix; labels are the routes' own paths
        self.paths = frozenset(prefix + route.path for route in router.routes)

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
            route = _route_label(scope, self.paths, self.prefix)
            if service is not None:
                count(service, route, status[0] if answered[0] and not scope.get(GONE) else None, started)


def _route_label(scope: dict[str, Any], paths: frozenset[str], prefix: str) -> str:
    """The route's template without the app's prefix (as `serving.front` counts the routes it answers), a bounded
    label set: the matched route's, or for a request answered before routing (the body limit's 413 and 415) the
    app's route whose path it asked for exactly; anything else is 'other'."""
    route = scope.get("route")
    path = route.path if route is not None else route_path(scope)
    if route is None and path not in paths:
        return "other"
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


def attach(app: Front, service: Service) -> Front:
    """Make `app` serve `service` (and bound its bodies by the service's max_body_bytes)."""
    app.state.service = service
    return app


def create_app(prefix: str = "") -> Front:
    """A fresh app (routes under `prefix`), to `attach` a service to before it serves."""
    under = prefix.rstrip("/")
    app = FastAPI(title="seq2onnx", version=runtime.__version__, docs_url=f"{under}/docs", redirect_slashes=False,
                  openapi_url=f"{under}/openapi.json", redoc_url=f"{under}/redoc",
                  swagger_ui_oauth2_redirect_url=None,  # no OAuth here; FastAPI's own route ignored the prefix
                  summary="Encoder-decoder models with attention, exported to ONNX")
    app.state.route_prefix = under
    app.include_router(router, prefix=under)
    app.add_middleware(BodyLimit)
    app.add_middleware(Measured, prefix=under)  # outermost: it sees the body limit's 413 too
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Seq2OnnxError, _refused)
    decode_routes = {prefix.rstrip("/") + route.path: route for route in router.routes
                     if route.path in ("/v1/translate", "/v1/predict")}
    return Front(app, decode_routes)


UNDECODED_BODY = "There was an error parsing the body"  # FastAPI's 400 for a body json.loads cannot take as text

KIND_FIELDS = ("texts", "source")  # the input field of each kind's route


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    for error in errors:
        field_name = error.get("loc", ())[-1] if error.get("type") == "extra_forbidden" else None
        if field_name in KIND_FIELDS and (service := _service(request)) is not None:
            # one kind's input on the other's route, whichever the model is: what the model takes, and where
            wrong = WrongKind(field_name, service.model.spec.kind)
            status, body, _ = refusal(wrong, client_prefix(request.scope, request.app.state))
            return JSONResponse(body, status_code=status)  # as the runtime's own refusals of the kind are answered
    return JSONResponse({"error": describe_validation(errors, request.headers.get("content-type"))}, status_code=422)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404, 405 and the like in the same shape as every other refusal; a body FastAPI could not decode (not UTF-8)
    is a 422, as one that is not JSON is."""
    if exc.status_code == 400 and exc.detail == UNDECODED_BODY:
        cause = exc.__cause__
        if isinstance(cause, strict_json.JsonRefused):
            why = f"refused: {cause}"
        elif isinstance(cause, RecursionError):  # arrays in arrays past Python's recursion limit
            why = "JSON nested too deeply to parse; send the arrays the route's schema (/docs) describes"
        elif isinstance(cause, UnicodeDecodeError):
            why = f"not UTF-8 (byte {cause.object[cause.start]:#04x} at offset {cause.start}); send JSON in UTF-8"
        else:
            why = f"unreadable ({one_line(cause)}); send JSON in UTF-8"
        return JSONResponse({"error": f"{request.method} {request.url.path}: the body is {why}"}, status_code=422)
    under = client_prefix(request.scope, request.app.state)
    service = _service(request)  # None on a Ray replica still loading: every route then
    kind = None if service is None else service.model.spec.kind
    return JSONResponse({"error": f"{request.method} {request.url.path}: {str(exc.detail).lower()}; the routes are "
                                  f"{routes(under, kind)}"}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def _refused(request: Request, exc: Seq2OnnxError) -> JSONResponse:
    status, body, headers = refusal(exc, client_prefix(request.scope, request.app.state))
    return JSONResponse(body, status_code=status, headers=headers)
