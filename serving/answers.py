"""What every backend and both HTTP paths answer: decode bodies, batch headers, refusals as (status, body,
headers), and the count of each request in the metrics."""
from __future__ import annotations

import time
from typing import Any

from runtime.errors import ResourceError, Seq2OnnxError, one_line

from .batching import Decoded
from .jobs import RequestTooLarge, WrongKind
from .service import DeadlineExceeded, Overloaded, Service


def _tolist(array: Any, arrays: bool = False) -> Any:
    return None if array is None else array if arrays else array.tolist()


def hypothesis(h: Any, arrays: bool = False) -> dict[str, Any]:
    """A runtime Translation as a JSON-ready dict (`arrays`: its attention left a numpy array, for
    `serving.encode`)."""
    return {"text": h.text, "tokens": h.tokens, "ids": h.ids, "score": h.score, "log_prob": h.log_prob,
            "finish_reason": h.finish_reason, "attention": _tolist(h.attention, arrays)}


def predict_body(service: Service, done: Decoded, return_attention: bool, arrays: bool = False) -> dict[str, Any]:
    """The /v1/predict answer of a decoded request (its own error raised); `arrays`: numpy arrays left as they are,
    for `serving.encode` to write a part at a time (lists otherwise: a deployment handle's answer)."""
    if isinstance(done.value, Exception):
        raise done.value
    outputs, attention = done.value
    return {"outputs": _tolist(outputs, arrays), "attention": _tolist(attention, arrays) if return_attention else None,
            "export_id": service.model.manifest.export_id}


def translate_body(service: Service, done: Decoded, arrays: bool = False) -> dict[str, Any]:
    """The /v1/translate answer of a decoded request (its own error raised); `arrays`: as for `predict_body`."""
    if isinstance(done.value, Exception):
        raise done.value
    return {"translations": [[hypothesis(h, arrays) for h in hyps] for hyps in done.value],
            "export_id": service.model.manifest.export_id}


def batch_headers(service: Service, done: Decoded) -> dict[str, str]:
    return {"x-seq2onnx-batch-requests": str(done.batch_requests), "x-seq2onnx-batch-rows": str(done.batch_rows),
            "x-seq2onnx-replica": service.name}


def client_prefix(scope: dict[str, Any], state: Any) -> str:
    """What a client puts before a route's own path: a mount's or Ray Serve's prefix, then the app's own."""
    return scope.get("root_path", "") + getattr(state, "route_prefix", "")


def refusal(exc: Seq2OnnxError, prefix: str = "") -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) of a request refused by the runtime or the service; routes it names are under
    `prefix` (`client_prefix`)."""
    if isinstance(exc, Overloaded):
        return 503, {"error": one_line(exc)}, {"retry-after": str(exc.retry_after_s)}
    if isinstance(exc, WrongKind):
        return 400, {"error": exc.under(prefix)}, {}
    if isinstance(exc, ResourceError):  # the server's memory, not the request's values: 503, without a retry time
        return 503, {"error": one_line(exc)}, {}
    status = 413 if isinstance(exc, RequestTooLarge) else 408 if isinstance(exc, DeadlineExceeded) else 400
    return status, {"error": one_line(exc)}, {}


def count(service: Service, route: str, status: int | None, started: float) -> None:
    """One request in the metrics: answered with `status`, or (None) ended without an answer."""
    if status is None:
        service.metrics.unanswered.inc()
        return
    service.metrics.requests.labels(route, str(status)).inc()
    service.metrics.latency.labels(route).observe(time.perf_counter() - started)
