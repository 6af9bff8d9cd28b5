"""A server's metrics in Prometheus' text format (prometheus-client), one registry per served model: requests by
route and status, their latency, the items per decode, what waits in the queue, and how long decodes take."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITEM_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class Metrics:
    """The collectors of one served model, in a registry of their own (so several can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("seq2onnx_requests", "HTTP requests answered, by route and status code",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("seq2onnx_request_duration_seconds", "Time from a request's arrival to its answer",
                                 ["route"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.batch_items = Histogram("seq2onnx_batch_items", "Items (sources or texts) decoded together",
                                     buckets=ITEM_BUCKETS, registry=self.registry)
        self.queue_items = Gauge("seq2onnx_queue_items", "Items waiting for a decode", registry=self.registry)
        self.unanswered = Counter("seq2onnx_unanswered", "Requests that ended without an answer: cut off at shutdown "
                                  "(past --shutdown-timeout), or their client went away", registry=self.registry)
        self.decode_seconds = Histogram("seq2onnx_decode_duration_seconds", "Time one batched decode takes",
                                        buckets=LATENCY_BUCKETS_S, registry=self.registry)

    def totals(self) -> tuple[int, int]:
        """(requests answered, requests that ended without an answer) so far."""
        answered = sum(s.value for m in self.requests.collect() for s in m.samples if s.name.endswith("_total"))
        unanswered = sum(s.value for m in self.unanswered.collect() for s in m.samples if s.name.endswith("_total"))
        return int(answered), int(unanswered)

    def text(self) -> bytes:
        """Every metric, in the text exposition format."""
        return generate_latest(self.registry)
