"""Prometheus metrics for /metrics: one registry per app (no module globals).

Everything is named `eagle_*` and labelled with `model_name`. Counters move from the engine
client's output listener (on the event loop), gauges are read from the engine client's
snapshots at scrape time. To add a metric: declare it in `__init__`, then update it in
`on_outputs` (per step outputs), `record_failure` (HTTP errors) or `_refresh_gauges` (scrape).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from eagle_core.outputs import RequestOutput
from server.engine_client import EngineClient

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

_MODEL = ["model_name"]


class ServerMetrics:
    def __init__(self, client: EngineClient, model_name: Callable[[], str]):
        self._client = client
        self._model_name = model_name
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt_tokens = Counter(
            "eagle_prompt_tokens", "Prompt tokens of finished sequences.", _MODEL, registry=r
        )
        self.generation_tokens = Counter(
            "eagle_generation_tokens", "Generated (completion) tokens.", _MODEL, registry=r
        )
        self.request_success = Counter(
            "eagle_request_success",
            "Finished engine sequences (one per choice) by finish reason.",
            [*_MODEL, "finished_reason"],
            registry=r,
        )
        self.request_failure = Counter(
            "eagle_request_failure",
            "HTTP requests answered with an error, by error code.",
            [*_MODEL, "reason"],
            registry=r,
        )
        self.running = Gauge(
            "eagle_num_requests_running", "Sequences in the running batch.", _MODEL, registry=r
        )
        self.waiting = Gauge(
            "eagle_num_requests_waiting", "Sequences waiting to be scheduled.", _MODEL, registry=r
        )
        self.peak_running = Gauge(
            "eagle_num_requests_running_peak",
            "Largest running batch seen since start (shows that requests were batched).",
            _MODEL,
            registry=r,
        )
        self.engine_steps = Counter(
            "eagle_engine_steps", "engine.step() calls that ran.", _MODEL, registry=r
        )
        self._steps_seen = 0
        client.output_listeners.append(self.on_outputs)

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        model = self._model_name()
        generated = sum(len(o.new_token_ids) for o in outputs)
        if generated:
            self.generation_tokens.labels(model).inc(generated)
        for out in outputs:
            if out.finished:
                self.prompt_tokens.labels(model).inc(out.num_prompt_tokens)
                self.request_success.labels(model, out.finish_reason or "unknown").inc()

    def record_failure(self, reason: str) -> None:
        self.request_failure.labels(self._model_name(), reason).inc()

    def _refresh_gauges(self) -> None:
        model = self._model_name()
        self.running.labels(model).set(self._client.num_running)
        self.waiting.labels(model).set(self._client.num_waiting)
        self.peak_running.labels(model).set(self._client.peak_running)
        steps = self._client.num_steps
        if steps > self._steps_seen:
            self.engine_steps.labels(model).inc(steps - self._steps_seen)
            self._steps_seen = steps

    def render(self) -> bytes:
        self._refresh_gauges()
        return generate_latest(self.registry)
