"""The Ray Serve deployment: a FastAPI ingress over one loaded model per replica, with dynamic batching.

Routes: POST /v1/predict (points), POST /v1/translate (tokens), GET /v1/model, GET /healthz; /docs shows the
schemas. Deployment-handle callers (other deployments, Ray tasks) use `predict` and `translate`, which go through
the same batcher. Every response says how it was batched in `x-seq2onnx-batch-requests` / `-rows` and which
replica served it in `x-seq2onnx-replica`."""
from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from ray.serve import Application
from starlette.exceptions import HTTPException as StarletteHTTPException

import runtime
from runtime.errors import Seq2OnnxError, one_line
from runtime.model import Seq2Seq

from .batching import (
    Decoded,
    PointJob,
    RequestTooLarge,
    TokenJob,
    decode_points,
    decode_texts,
    point_job,
    token_job,
)
from .config import ServeConfig
from .limits import BodyLimit, describe_validation
from .schemas import (
    ErrorBody,
    ModelInfo,
    PredictRequest,
    PredictResponse,
    TranslateRequest,
    TranslateResponse,
)

REFUSALS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 413, 422)}

app = FastAPI(title="seq2onnx", version=runtime.__version__,
              summary="Encoder-decoder models with attention, exported to ONNX, served on Ray Serve")
app.add_middleware(BodyLimit)


@app.exception_handler(RequestValidationError)
async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse({"error": describe_validation(exc.errors())}, status_code=422)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404, 405 and the like in the same shape as every other refusal."""
    return JSONResponse({"error": f"{request.method} {request.url.path}: {str(exc.detail).lower()}; the routes are "
                                  "POST /v1/predict, POST /v1/translate, GET /v1/model, GET /healthz, GET /docs"},
                        status_code=exc.status_code, headers=getattr(exc, "headers", None))


@app.exception_handler(Seq2OnnxError)
async def _refused(request: Request, exc: Seq2OnnxError) -> JSONResponse:
    return JSONResponse({"error": one_line(exc)}, status_code=413 if isinstance(exc, RequestTooLarge) else 400)


def _rows(jobs: list[PointJob] | list[TokenJob]) -> int:
    return sum(job.rows for job in jobs)


def _tolist(array: Any) -> Any:
    return None if array is None else array.tolist()


def hypothesis(h: Any) -> dict[str, Any]:
    """A runtime Translation as a JSON-ready dict."""
    return {"text": h.text, "tokens": h.tokens, "ids": h.ids, "score": h.score, "log_prob": h.log_prob,
            "attention": _tolist(h.attention)}


@serve.deployment
@serve.ingress(app)
class Seq2SeqService:
    """One replica: the model loaded once, requests batched by `serve.batch` and decoded in a worker thread."""

    def __init__(self, model_dir: str | None, config: ServeConfig) -> None:
        self.config = config
        self.model = Seq2Seq.load(model_dir or os.getcwd(), provider=config.provider, threads=config.threads)
        for batcher in (self._points, self._texts):
            batcher.set_max_batch_size(config.max_batch_size)
            batcher.set_batch_wait_timeout_s(config.batch_wait_ms / 1000)
        app.state.max_body_bytes = config.max_body_bytes
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005, batch_size_fn=_rows)
    async def _points(self, jobs: list[PointJob]) -> list[Decoded]:
        return await asyncio.to_thread(decode_points, self.model, jobs)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005, batch_size_fn=_rows)
    async def _texts(self, jobs: list[TokenJob]) -> list[Decoded]:
        return await asyncio.to_thread(decode_texts, self.model, jobs)

    async def predict(self, source: Any, source_mask: Any = None, target_len: int | None = None,
                      return_attention: bool = False) -> dict[str, Any]:
        """Handle callers: `Seq2Seq.predict` through the batcher -> {"outputs", "attention", "export_id"}."""
        body, _ = await self._predict(PredictRequest.model_construct(
            source=source, source_mask=source_mask, target_len=target_len, return_attention=return_attention))
        return body

    async def translate(self, texts: list[str], **options: Any) -> list[list[dict[str, Any]]]:
        """Handle callers: `Seq2Seq.translate_batch` through the batcher -> per text, n-best hypothesis dicts."""
        body, _ = await self._translate(texts, TranslateRequest.model_construct(texts=texts).options() | options)
        return body["translations"]

    async def _predict(self, request: PredictRequest) -> tuple[dict[str, Any], Decoded]:
        job = point_job(self.model, request.source, request.source_mask, request.target_len,
                        self.config.max_batch_size, self.config.max_decoding_length)
        done = await self._points(job)
        if isinstance(done.value, Exception):
            raise done.value
        outputs, attention = done.value
        return {"outputs": outputs.tolist(), "attention": _tolist(attention) if request.return_attention else None,
                "export_id": self.model.manifest.export_id}, done

    async def _translate(self, texts: Any, options: dict[str, Any]) -> tuple[dict[str, Any], Decoded]:
        done = await self._texts(token_job(self.model, texts, options, self.config.max_batch_size,
                                           self.config.max_decoding_length))
        if isinstance(done.value, Exception):
            raise done.value
        return {"translations": [[hypothesis(h) for h in hyps] for hyps in done.value],
                "export_id": self.model.manifest.export_id}, done

    def _reply(self, body: dict[str, Any], done: Decoded) -> JSONResponse:
        return JSONResponse(body, headers={"x-seq2onnx-batch-requests": str(done.batch_requests),
                                           "x-seq2onnx-batch-rows": str(done.batch_rows),
                                           "x-seq2onnx-replica": self.replica})

    @app.post("/v1/predict", response_model=PredictResponse, responses=REFUSALS)
    async def http_predict(self, request: PredictRequest) -> JSONResponse:
        """Point models: predict target_len points per source sequence."""
        return self._reply(*await self._predict(request))

    @app.post("/v1/translate", response_model=TranslateResponse, responses=REFUSALS)
    async def http_translate(self, request: TranslateRequest) -> JSONResponse:
        """Token models: translate texts with greedy search, beam search or sampling."""
        return self._reply(*await self._translate(request.texts, request.options()))

    @app.get("/v1/model", response_model=ModelInfo)
    async def info(self) -> ModelInfo:
        """The model's spec, export id and vocabulary sizes; the providers and batching of this replica."""
        model, config = self.model, self.config
        sizes = {side: len(vocab) for side, vocab in model.vocabularies.items()} or None
        return ModelInfo(kind=model.spec.kind, spec=dataclasses.asdict(model.spec),
                         export_id=model.manifest.export_id, vocabulary_size=sizes, providers=model.providers,
                         threads=config.threads, max_batch_size=config.max_batch_size,
                         batch_wait_ms=config.batch_wait_ms, replica=self.replica, node=self.node,
                         version=runtime.__version__)

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        """Liveness: 200 while this replica can take requests."""
        return {"status": "ok", "replica": self.replica}


def build_app(model_dir: str | Path | None, config: ServeConfig = ServeConfig()) -> Application:
    """The application for `serve.run`: replicas, CPUs and batching from `config`. model_dir None loads from each
    replica's working directory: the model shipped with `ray.init(runtime_env={"working_dir": model_dir})`."""
    replicas = config.replicas
    scaling: dict[str, Any] = ({"num_replicas": replicas.low} if replicas.fixed else {"autoscaling_config": {
        "min_replicas": replicas.low, "max_replicas": replicas.high,
        "target_ongoing_requests": config.max_batch_size}})
    deployment = Seq2SeqService.options(max_ongoing_requests=config.max_ongoing_requests,
                                        ray_actor_options={"num_cpus": config.num_cpus}, **scaling)
    return deployment.bind(None if model_dir is None else str(Path(model_dir).resolve()), config)
