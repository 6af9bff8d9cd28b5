"""The Ray Serve deployment: the same HTTP app (`serving.http`) and `Service` (its batcher, queue bound, deadlines
and metrics) in every replica, one loaded model each.

Deployment-handle callers (other deployments, Ray tasks) use `predict` and `translate`, which go through the same
batcher. Serve's own request timeout (`http_options.request_timeout_s`) is set a little past the service's, so
the service answers 408 first and stops the decode."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve import Application

from runtime.errors import InputError
from runtime.model import Seq2Seq

from .answers import predict_body, translate_body
from .config import ServeConfig, check_number
from .http import create_app
from .schemas import TranslateRequest
from .service import Service, serve_in_this_process

app = create_app()
DEFAULT_DRAIN_TIMEOUT_S = 20.0  # Serve's own default
DRAIN_POLL_S = 0.5  # Serve logs a line at each look while requests are under way


@serve.deployment
@serve.ingress(app)
class Seq2SeqService:
    """One replica: the model loaded once, behind the service's batcher."""

    def __init__(self, model_dir: str | None, config: ServeConfig) -> None:
        model = Seq2Seq.load(model_dir or os.getcwd(), provider=config.provider, threads=config.threads)
        replica = serve.get_replica_context().replica_id.unique_id
        self.service = Service(model, config, replica, node=ray.get_runtime_context().get_node_id())
        serve_in_this_process(self.service)  # Serve serves its own copy of `app`, made after this

    async def predict(self, source: Any, source_mask: Any = None, target_len: int | None = None,
                      return_attention: bool = False) -> dict[str, Any]:
        """Handle callers: `Seq2Seq.predict` through the batcher -> {"outputs", "attention", "export_id"}."""
        done = await self.service.predict(source, source_mask, target_len, return_attention)
        return predict_body(self.service, done, return_attention)

    async def translate(self, texts: list[str], **options: Any) -> list[list[dict[str, Any]]]:
        """Handle callers: `Seq2Seq.translate_batch` through the batcher -> per text, n-best hypothesis dicts."""
        done = await self.service.translate(texts, TranslateRequest.model_construct(texts=texts).options() | options)
        return translate_body(self.service, done)["translations"]


def build_app(model_dir: str | Path | None, config: ServeConfig = ServeConfig(),
              drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> Application:
    """The application for `serve.run`: replicas, CPUs and batching from `config`. model_dir None loads from each
    replica's working directory: the model shipped with `ray.init(runtime_env={"working_dir": model_dir})`.
    Removed (`serve.delete`), a replica takes no new request and finishes those under way for up to
    `drain_timeout_s`, looking every DRAIN_POLL_S (Serve's default looks every 2 s)."""
    if config.workers != 1:
        raise InputError(f"workers: {config.workers} copies of the model in one process are for the one-process "
                         "server; on Ray Serve every replica holds a copy: set how many with replicas and leave "
                         "workers 1")
    drain_timeout_s = check_number("drain_timeout_s", drain_timeout_s, 0, 3600)
    replicas = config.replicas
    scaling: dict[str, Any] = ({"num_replicas": replicas.low} if replicas.fixed else {"autoscaling_config": {
        "min_replicas": replicas.low, "max_replicas": replicas.high,
        "target_ongoing_requests": config.max_batch_size}})
    deployment = Seq2SeqService.options(max_ongoing_requests=config.max_ongoing_requests,
                                        ray_actor_options={"num_cpus": config.num_cpus},
                                        graceful_shutdown_timeout_s=drain_timeout_s,
                                        graceful_shutdown_wait_loop_s=DRAIN_POLL_S, **scaling)
    return deployment.bind(None if model_dir is None else str(Path(model_dir).resolve()), config)
