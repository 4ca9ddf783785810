"""Prometheus metrics for /metrics: one registry per app (no module globals).

Every series is named `eagle_*` and labelled `model_name`; docs/metrics.md says what each one
means. Three sources feed them, all on the event loop's thread:

- the engine client's request events (`RequestObserver`): submit time, then each step's
  RequestOutputs as they are handed to the request streams. Request latencies (TTFT, per-token
  ITL, end-to-end, queue time), token counts, finish reasons and acceptance lengths come from
  here, timed with `time.monotonic()` (the same clock as the engine's own timestamps);
- the streaming responses (`StreamObserver`): the gaps between content chunks a streaming
  client receives, and engine failures that end a stream whose 200 status is already sent;
- the engine's cumulative counters (`engine.stats`, snapshotted by the engine client after each
  step): preemptions, drafts, draft/accepted tokens, acceptance by position, fallbacks. They are
  turned into Prometheus counters by adding the increase since the last look.

To add a metric: declare it in `_declare`, then update it from one of those sources.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from eagle_core.outputs import RequestOutput
from server.engine_client import EngineClient

__all__ = [
    "CONTENT_TYPE_LATEST",
    "SERVER_FAILURE_REASONS",
    "ServerMetrics",
    "StreamObserver",
    "per_token_latencies",
]

_MODEL = ["model_name"]

# Bucket edges. Latencies span a GPU serving a small model (a few ms per step, a speculative
# step shared by several tokens: well under 1 ms per token) to a CPU serving SmolLM2 (tens to
# hundreds of ms per token, seconds for a long prefill), so every latency histogram has about
# 3-4 edges per decade from 1 ms up.
TOKEN_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Inter-token and inter-chunk latency."""
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
"""Time to first token; 5 s (the EagleTimeToFirstTokenHigh threshold) is an edge."""
REQUEST_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
    90.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
)  # fmt: skip
"""End-to-end request latency."""
QUEUE_TIME_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
"""Submit to first scheduled."""
TOKEN_COUNT_BUCKETS = tuple(
    float(m * 10**e) for e in range(6) for m in (1, 2, 5) if m * 10**e <= 200_000
)
"""Prompt and generation tokens per request: 1, 2, 5, 10, ... 200000."""
MAX_ACCEPTANCE_LENGTH_BUCKET = 16
ACCEPTANCE_LENGTH_BUCKETS = tuple(float(k) for k in range(1, MAX_ACCEPTANCE_LENGTH_BUCKET + 1))
"""Tokens emitted per verified tree: an integer from 1 (nothing accepted) to depth + 1, so one
edge per integer makes every bucket exact."""

SERVER_FAILURE_REASONS = ("internal_error", "queue_full", "engine_failed")
"""The `reason`s of eagle_request_failure_total that are the server's failure (500, 429 when
the waiting queue is full, and 503 once the engine has died). Every other reason is an HTTP
error the client caused (401 bad key, 413 body too large, 400 invalid value, 404 unknown model
or route, ...). The error-rate alert and the dashboard's error-rate stat count only these; keep
them in step with server/errors.py."""


def per_token_latencies(gap_s: float, num_tokens: int) -> list[float]:
    """Inter-token latency samples of one delivery: `num_tokens` tokens that arrived `gap_s`
    after the previous delivery of the same sequence count as that many tokens of
    `gap_s / num_tokens` each. Speculation delivers several tokens per step; this keeps the
    histogram's mean equal to (time between first and last token) / (tokens after the first
    delivery), the figure a reader of "inter-token latency" expects."""
    if num_tokens <= 0:
        return []
    return [max(gap_s, 0.0) / num_tokens] * num_tokens


@dataclass
class _Timeline:
    """What the metrics remember about one engine request between its outputs."""

    submit_time: float
    last_token_time: float | None = None
    queue_time_observed: bool = False


class StreamObserver:
    """Watches one streamed response: times the gaps between content chunks per choice, and
    records an engine failure that ends the stream (its 200 status is already on the wire, so
    no error handler sees it)."""

    def __init__(self, metrics: ServerMetrics, num_choices: int):
        self._metrics = metrics
        self._last_chunk: list[float | None] = [None] * num_choices

    def on_chunk(self, index: int, now: float) -> None:
        last = self._last_chunk[index]
        if last is not None:
            self._metrics.inter_chunk_latency.labels(self._metrics.model_name()).observe(
                max(now - last, 0.0)
            )
        self._last_chunk[index] = now

    def on_failure(self, reason: str) -> None:
        self._metrics.record_failure(reason)


class ServerMetrics:
    """All metrics of one app. Registers itself as an observer of the engine client."""

    def __init__(self, client: EngineClient, model_name: Callable[[], str]):
        self._client = client
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._declare(self.registry)
        self._timelines: dict[str, _Timeline] = {}
        self._seen: dict[Any, float] = {}  # engine counter key -> value already exported
        self._info_model: str | None = None  # model_name the series were initialised for
        client.observers.append(self)

    def _declare(self, r: CollectorRegistry) -> None:
        self._per_model: list[Histogram | Counter] = []
        """The metrics labelled by the model name alone: their series exist from the start."""

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            metric = Histogram(name, doc, _MODEL, buckets=buckets, registry=r)
            self._per_model.append(metric)
            return metric

        def counter(name: str, doc: str, *labels: str) -> Counter:
            metric = Counter(name, doc, [*_MODEL, *labels], registry=r)
            if not labels:
                self._per_model.append(metric)
            return metric

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, [*_MODEL, *labels], registry=r)

        # --- requests (from the engine client's outputs, per engine request = one choice)
        self.time_to_first_token = histogram(
            "eagle_time_to_first_token_seconds",
            "Submit to first generated token delivered, per sequence.",
            TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "eagle_inter_token_latency_seconds",
            "Time per generated token after the first delivery: a delivery of k tokens after a "
            "gap g counts k samples of g/k.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.inter_chunk_latency = histogram(
            "eagle_inter_chunk_latency_seconds",
            "Gap between consecutive content chunks of a streamed choice (one speculative step "
            "can put several tokens in one chunk).",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "eagle_e2e_request_latency_seconds",
            "Submit to finish of sequences that finished with stop or length (not aborted).",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_queue_time = histogram(
            "eagle_request_queue_time_seconds",
            "Submit to first scheduled by the engine, per sequence.",
            QUEUE_TIME_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "eagle_request_prompt_tokens",
            "Prompt tokens of sequences that finished with stop or length.",
            TOKEN_COUNT_BUCKETS,
        )
        self.request_generation_tokens = histogram(
            "eagle_request_generation_tokens",
            "Generated tokens of sequences that finished with stop or length.",
            TOKEN_COUNT_BUCKETS,
        )
        self.acceptance_length = histogram(
            "eagle_spec_decode_acceptance_length",
            "Tokens emitted by one sequence in one step that verified a draft tree (accepted "
            "draft tokens + 1).",
            ACCEPTANCE_LENGTH_BUCKETS,
        )
        self.prompt_tokens = counter(
            "eagle_prompt_tokens",
            "Prompt tokens of sequences whose prefill finished (counted at their first token).",
        )
        self.generation_tokens = counter(
            "eagle_generation_tokens", "Generated (completion) tokens delivered."
        )
        self.request_success = counter(
            "eagle_request_success",
            "Finished sequences (one per choice) by finish reason: stop, length or abort.",
            "finished_reason",
        )
        self.request_failure = counter(
            "eagle_request_failure",
            "HTTP requests answered with an error (or streams ended by one), by error code. "
            "internal_error and queue_full are the server's failures; the others are client "
            "errors.",
            "reason",
        )
        # --- engine counters (from engine.stats)
        self.num_preemptions = counter(
            "eagle_num_preemptions", "Sequences preempted (KV freed, recomputed later)."
        )
        self.prefix_cache_queries = counter(
            "eagle_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache (each request's prompt, at admission).",
        )
        self.prefix_cache_hits = counter(
            "eagle_prefix_cache_hits", "Of the prompt tokens looked up, those whose KV came from the cache."
        )
        self.spec_num_drafts = counter(
            "eagle_spec_decode_num_drafts", "Sequence-steps that verified a draft tree."
        )
        self.spec_num_draft_tokens = counter(
            "eagle_spec_decode_num_draft_tokens", "Draft tokens verified by the target."
        )
        self.spec_num_accepted_tokens = counter(
            "eagle_spec_decode_num_accepted_tokens", "Draft tokens the target accepted."
        )
        self.spec_accepted_per_pos = counter(
            "eagle_spec_decode_num_accepted_tokens_per_pos",
            "Sequence-steps whose accepted path reached draft position `position` (0: the "
            "first draft token after the root was accepted).",
            "position",
        )
        self.spec_fallback = counter(
            "eagle_spec_decode_fallback",
            "Decode steps of a speculating engine that ran without a draft tree, by reason.",
            "reason",
        )
        # --- gauges (read at scrape time)
        self.num_requests_running = gauge(
            "eagle_num_requests_running", "Sequences in the running batch."
        )
        self.num_requests_waiting = gauge(
            "eagle_num_requests_waiting", "Sequences waiting to be scheduled."
        )
        self.num_requests_running_peak = gauge(
            "eagle_num_requests_running_peak",
            "Largest running batch since start (shows that requests were batched).",
        )
        self.kv_cache_usage = gauge(
            "eagle_kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1)."
        )
        # --- the speculation policy (engine.stats["spec_policy"]; absent when pinned or plain)
        self.spec_policy_drafting = gauge(
            "eagle_spec_policy_drafting_sequences",
            "Decoding sequences the speculation policy let draft with the head in the last step.",
        )
        self.spec_policy_tree_tokens = gauge(
            "eagle_spec_policy_tree_tokens",
            "Tokens of each head tree (root included) the speculation policy chose for the last "
            "step; 0 when nobody drafted with the head.",
        )
        self.spec_policy_goodput = gauge(
            "eagle_spec_policy_expected_tokens_per_second",
            "Emitted tokens per second the policy expected of the last step's choice.",
        )
        self.spec_policy_step_seconds = gauge(
            "eagle_spec_policy_step_seconds",
            "The policy's cost model: seconds of a step whose target computes `batch` rows "
            "(kind=plain); for `batch` drafting sequences, seconds their first draft forward and "
            "tree bookkeeping add (kind=draft) and seconds of each further draft forward "
            "(kind=level); measured at start-up, then following served steps.",
            "kind", "batch",
        )
        self.spec_policy_feed_seconds = gauge(
            "eagle_spec_policy_feed_seconds",
            "The policy's cost model: seconds per draft entry a sequence owes the head before it "
            "drafts again (after steps without drafting).",
        )
        self.spec_policy_acceptance = gauge(
            "eagle_spec_policy_head_acceptance",
            "The policy's running average of head draft tokens accepted per step with trees of "
            "`tree_tokens` tokens, over greedy or sampling requests (what it expects of a new "
            "request).",
            "sampling", "tree_tokens",
        )
        self.model_info = Info(
            "eagle_model",
            "What this server runs: target model, draft head, dtype, device, draft tree.",
            _MODEL,
            registry=r,
        )

    # ------------------------------------------------------------------ RequestObserver

    def on_submit(self, request_ids: list[str], now: float) -> None:
        for rid in request_ids:
            self._timelines[rid] = _Timeline(now)

    def on_forget(self, request_ids: list[str]) -> None:
        """The requests were rejected or failed: no more outputs will come for them."""
        for rid in request_ids:
            self._timelines.pop(rid, None)

    def on_outputs(self, outputs: list[RequestOutput], now: float) -> None:
        model = self.model_name()
        for out in outputs:
            timeline = self._timelines.get(out.request_id)
            if timeline is None:  # rejected or failed (forgotten): its abort output is no news
                continue
            self._observe_output(model, out, timeline, now)
            if out.finished:
                del self._timelines[out.request_id]
        self._sync_engine_counters(model)

    def _observe_output(
        self, model: str, out: RequestOutput, timeline: _Timeline, now: float
    ) -> None:
        if not timeline.queue_time_observed and out.first_scheduled_time is not None:
            timeline.queue_time_observed = True
            queue_time = out.first_scheduled_time - timeline.submit_time
            self.request_queue_time.labels(model).observe(max(queue_time, 0.0))
        num_new = len(out.new_token_ids)
        if num_new:
            self.generation_tokens.labels(model).inc(num_new)
            if timeline.last_token_time is None:
                self.time_to_first_token.labels(model).observe(now - timeline.submit_time)
                self.prompt_tokens.labels(model).inc(out.num_prompt_tokens)
            else:
                itl = self.inter_token_latency.labels(model)
                for sample in per_token_latencies(now - timeline.last_token_time, num_new):
                    itl.observe(sample)
            timeline.last_token_time = now
        if out.num_draft_tokens_step > 0:
            self.acceptance_length.labels(model).observe(out.num_accepted_tokens_step + 1)
        if out.finished:
            reason = out.finish_reason or "unknown"
            self.request_success.labels(model, reason).inc()
            if reason != "abort":
                self.e2e_request_latency.labels(model).observe(now - timeline.submit_time)
                self.request_prompt_tokens.labels(model).observe(out.num_prompt_tokens)
                self.request_generation_tokens.labels(model).observe(out.num_output_tokens)

    # ------------------------------------------------------------------ other sources

    def record_failure(self, reason: str) -> None:
        self.request_failure.labels(self.model_name(), reason).inc()

    def stream_observer(self, num_choices: int) -> StreamObserver:
        return StreamObserver(self, num_choices)

    def _sync_engine_counters(self, model: str) -> None:
        """Export the increase of the engine's cumulative counters since the last call."""
        stats = self._client.engine_stats
        if not stats:
            return
        simple = (
            ("num_preemptions", self.num_preemptions),
            ("prefix_cache_queried_tokens", self.prefix_cache_queries),
            ("prefix_cache_hit_tokens", self.prefix_cache_hits),
            ("spec_num_drafts", self.spec_num_drafts),
            ("spec_num_draft_tokens", self.spec_num_draft_tokens),
            ("spec_num_accepted_tokens", self.spec_num_accepted_tokens),
        )
        for key, counter in simple:
            if key in stats:
                self._advance(key, counter.labels(model), stats[key])
        max_positions = self._num_tree_positions()
        for position, value in enumerate(stats.get("spec_accepted_per_position") or []):
            if position < max_positions or value:
                child = self.spec_accepted_per_pos.labels(model, str(position))
                self._advance(("position", position), child, value)
        for reason, value in (stats.get("spec_fallbacks") or {}).items():
            self._advance(("fallback", reason), self.spec_fallback.labels(model, reason), value)

    def _advance(self, key: Any, child: Counter, value: float) -> None:
        increase = value - self._seen.get(key, 0)
        if increase > 0:
            child.inc(increase)
        self._seen[key] = max(value, self._seen.get(key, 0))

    def _num_tree_positions(self) -> float:
        """Draft positions an accepted path can reach (the head's tree depth, or a context
        lookup chain's length); 0 without a draft head. Positions past it are exported only if
        they ever count something."""
        spec = getattr(getattr(self._client.engine, "config", None), "spec", None)
        if spec is None:
            return math.inf  # an engine without a config (test doubles): export them all
        return max(spec.depth, spec.lookup_tokens or 0) if spec.draft else 0

    def _refresh_gauges(self, model: str) -> None:
        client = self._client
        self.num_requests_running.labels(model).set(client.num_running)
        self.num_requests_waiting.labels(model).set(client.num_waiting)
        self.num_requests_running_peak.labels(model).set(client.peak_running)
        self.kv_cache_usage.labels(model).set(float(client.engine_stats.get("kv_cache_usage", 0)))
        policy = client.engine_stats.get("spec_policy")
        if policy:
            self.spec_policy_drafting.labels(model).set(policy["drafting"])
            self.spec_policy_tree_tokens.labels(model).set(policy["tree_nodes"])
            self.spec_policy_goodput.labels(model).set(policy["expected_tokens_per_second"])
            for kind in ("plain", "draft", "level"):
                table = policy["costs"][kind]
                for batch, seconds in table.items():
                    self.spec_policy_step_seconds.labels(model, kind, str(batch)).set(seconds)
            self.spec_policy_feed_seconds.labels(model).set(policy["costs"]["feed"])
            for sampling, by_size in policy["head_acceptance"].items():
                for tree_tokens, value in by_size.items():
                    self.spec_policy_acceptance.labels(model, sampling, str(tree_tokens)).set(value)
        if self._info_model != model:
            self.model_info.labels(model).info(model_info(client.engine))
            self._initialise_series(model)
            self._info_model = model

    def _initialise_series(self, model: str) -> None:
        """Create at zero the series that dashboards and alerts read, so that a fresh server
        shows zeros rather than "no data" and rate() has a starting point: every per-model
        metric, the finish reasons and the server's failure reasons."""
        for metric in self._per_model:
            metric.labels(model)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(model, reason)
        for reason in SERVER_FAILURE_REASONS:
            self.request_failure.labels(model, reason)

    def render(self) -> bytes:
        # Before the engine has loaded, the model name (and so every label) may not be final:
        # export nothing engine-related until it is.
        if self._client.engine is not None:
            model = self.model_name()
            self._sync_engine_counters(model)
            self._refresh_gauges(model)
        return generate_latest(self.registry)


def model_info(engine: Any) -> dict[str, str]:
    """The eagle_model_info labels: target model, draft head, dtype, device, draft tree, and the
    draft head's weight format (int8 or the model dtype)."""
    worker = getattr(engine, "worker", None)
    spec = getattr(getattr(engine, "config", None), "spec", None)
    draft = getattr(spec, "draft", None)
    dtype = getattr(worker, "dtype", None)
    return {
        "model": str(getattr(engine, "model_name", None) or "unknown"),
        "draft": str(draft) if draft else "none",
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else "unknown",
        "device": str(getattr(worker, "device", None) or "unknown"),
        "tree": (
            f"num_draft_tokens={spec.num_draft_tokens},depth={spec.depth},top_k={spec.top_k},"
            f"lookup_tokens={spec.lookup_tokens}"
            if draft
            else "none"
        ),
        "draft_weights": str(getattr(worker, "draft_weights", None) or "none") if draft else "none",
    }
