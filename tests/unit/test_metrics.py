"""server/metrics.py without a model: per-token ITL split, request timelines fed by hand-made
outputs at chosen times, engine counters exported as deltas, bucket choices, and the error
reasons the alert counts. The last tests run the app on FakeEngine for the streaming hooks."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from eagle_core.config import SPEC_DEFAULTS, EngineConfig, SpecConfig
from eagle_core.outputs import RequestOutput
from server import errors
from server.metrics import (
    ACCEPTANCE_LENGTH_BUCKETS,
    QUEUE_TIME_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    SERVER_FAILURE_REASONS,
    TOKEN_COUNT_BUCKETS,
    TOKEN_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    ServerMetrics,
    model_info,
    per_token_latencies,
)

try:
    from tests.unit.test_server_app import make_server
except ImportError:  # pytest's rootdir-relative import mode
    from test_server_app import make_server

REPO = Path(__file__).resolve().parents[2]
M = "tiny"


# ---------------------------------------------------------------- helpers


def stub_client(engine=None, stats=None) -> SimpleNamespace:
    """The parts of EngineClient that ServerMetrics reads."""
    return SimpleNamespace(
        observers=[],
        engine=engine,
        engine_stats=stats or {},
        num_running=0,
        num_waiting=0,
        peak_running=0,
    )


def stub_engine(draft: str | None = "/heads/tiny", depth: int = 3, lookup: int = 0) -> SimpleNamespace:
    spec = SpecConfig(draft=draft, num_draft_tokens=8, depth=depth, top_k=2, lookup_tokens=lookup)
    return SimpleNamespace(
        model_name="org/tiny-llama",
        config=EngineConfig(spec=spec),
        worker=SimpleNamespace(dtype="torch.float32", device="cpu", draft_weights="int8" if draft else None),
    )


def make_metrics(**kw) -> tuple[ServerMetrics, SimpleNamespace]:
    client = stub_client(**kw)
    return ServerMetrics(client, lambda: M), client  # type: ignore[arg-type]


def out(
    rid: str = "r-0",
    tokens: int = 1,
    *,
    finish: str | None = None,
    drafted: int = 0,
    accepted: int = 0,
    prompt: int = 5,
    total: int = 0,
    scheduled: float | None = 10.0,
) -> RequestOutput:
    return RequestOutput(
        request_id=rid,
        new_token_ids=list(range(tokens)),
        new_text="x" * tokens,
        finished=finish is not None,
        finish_reason=finish,
        num_prompt_tokens=prompt,
        num_output_tokens=total,
        num_draft_tokens_step=drafted,
        num_accepted_tokens_step=accepted,
        first_scheduled_time=scheduled,
    )


def value(m: ServerMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, {"model_name": M, **labels})
    return 0.0 if v is None else v


def hist(m: ServerMetrics, name: str) -> tuple[float, float]:
    return value(m, f"{name}_count"), value(m, f"{name}_sum")


# ---------------------------------------------------------------- per-token ITL


def test_per_token_latencies_split_a_chunk_evenly():
    assert per_token_latencies(0.3, 3) == pytest.approx([0.1, 0.1, 0.1])
    assert sum(per_token_latencies(0.25, 4)) == pytest.approx(0.25)
    assert per_token_latencies(0.05, 1) == [0.05]
    assert per_token_latencies(0.1, 0) == []
    assert per_token_latencies(-1e-9, 2) == [0.0, 0.0]  # clock jitter never goes negative


def test_request_timeline_ttft_itl_e2e_queue():
    m, _ = make_metrics()
    m.on_submit(["r-0"], 9.5)
    m.on_outputs([out(tokens=0, scheduled=10.0)], 10.0)  # a prefill chunk: no token yet
    assert hist(m, "eagle_request_queue_time_seconds") == (1, pytest.approx(0.5))
    assert hist(m, "eagle_time_to_first_token_seconds")[0] == 0
    m.on_outputs([out(tokens=2, drafted=0, total=2)], 10.5)  # first delivery: 2 tokens
    assert hist(m, "eagle_time_to_first_token_seconds") == (1, pytest.approx(1.0))
    assert hist(m, "eagle_inter_token_latency_seconds")[0] == 0  # no gap before the first
    m.on_outputs([out(tokens=3, drafted=7, accepted=2, total=5)], 11.25)
    m.on_outputs([out(tokens=1, drafted=7, accepted=0, total=6, finish="length")], 11.5)
    # 3 tokens after 0.75 s -> three samples of 0.25 s; then 1 token after 0.25 s.
    assert hist(m, "eagle_inter_token_latency_seconds") == (4, pytest.approx(1.0))
    assert value(m, "eagle_inter_token_latency_seconds_bucket", le="0.2") == 0
    assert value(m, "eagle_inter_token_latency_seconds_bucket", le="0.3") == 4
    assert hist(m, "eagle_e2e_request_latency_seconds") == (1, pytest.approx(2.0))
    assert hist(m, "eagle_spec_decode_acceptance_length") == (2, 4)  # 2+1 and 0+1
    assert value(m, "eagle_spec_decode_acceptance_length_bucket", le="1.0") == 1
    assert value(m, "eagle_generation_tokens_total") == 6
    assert value(m, "eagle_prompt_tokens_total") == 5  # once, at the first token
    assert hist(m, "eagle_request_prompt_tokens") == (1, 5)
    assert hist(m, "eagle_request_generation_tokens") == (1, 6)
    assert value(m, "eagle_request_success_total", finished_reason="length") == 1
    assert hist(m, "eagle_request_queue_time_seconds")[0] == 1  # once per request
    assert not m._timelines


def test_interleaved_requests_keep_their_own_gaps():
    m, _ = make_metrics()
    m.on_submit(["a-0", "a-1"], 0.0)
    m.on_outputs([out("a-0", 1), out("a-1", 1)], 1.0)
    m.on_outputs([out("a-0", 2)], 1.4)
    m.on_outputs([out("a-1", 1)], 2.0)
    assert hist(m, "eagle_time_to_first_token_seconds") == (2, pytest.approx(2.0))
    # a-0: 2 tokens after 0.4 s; a-1: 1 token after 1.0 s.
    assert hist(m, "eagle_inter_token_latency_seconds") == (3, pytest.approx(1.4))


def test_aborted_requests_count_as_abort_but_skip_request_latencies():
    m, _ = make_metrics()
    m.on_submit(["r-0"], 0.0)
    m.on_outputs([out(tokens=1, total=1)], 1.0)
    m.on_outputs([out(tokens=0, total=1, finish="abort")], 2.0)
    assert value(m, "eagle_request_success_total", finished_reason="abort") == 1
    assert hist(m, "eagle_e2e_request_latency_seconds")[0] == 0
    assert hist(m, "eagle_request_generation_tokens")[0] == 0
    assert value(m, "eagle_generation_tokens_total") == 1


def test_forgotten_requests_leave_no_trace():
    """A rejected or failed request's late abort output is no success and no latency."""
    m, _ = make_metrics()
    m.on_submit(["r-0", "r-1"], 0.0)
    m.on_forget(["r-0", "r-1"])
    m.on_outputs([out("r-0", 0, finish="abort"), out("r-1", 0, finish="abort")], 1.0)
    assert value(m, "eagle_request_success_total", finished_reason="abort") == 0
    assert not m._timelines


# ---------------------------------------------------------------- engine counters


def spec_stats(drafts, drafted, accepted, per_pos, fallbacks=None, preemptions=0, kv=0.25):
    return {
        "num_steps": drafts,
        "num_preemptions": preemptions,
        "num_running": 1,
        "num_waiting": 0,
        "kv_cache_usage": kv,
        "spec_num_drafts": drafts,
        "spec_num_draft_tokens": drafted,
        "spec_num_accepted_tokens": accepted,
        "spec_accepted_per_position": per_pos,
        "spec_fallbacks": fallbacks or {},
        "prefix_cache_queried_tokens": 100 * drafts,
        "prefix_cache_hit_tokens": 64 * drafts,
    }


def test_engine_counters_export_their_increase():
    m, client = make_metrics(engine=stub_engine(depth=3))
    client.engine_stats = spec_stats(2, 14, 3, [2, 1, 0, 0, 0, 0, 0], {"length_cap": 1})
    m.render()
    client.engine_stats = spec_stats(
        5, 35, 6, [4, 2, 0, 0, 0, 0, 0], {"length_cap": 1, "token_budget": 2}, preemptions=1
    )
    m.on_outputs([], 0.0)
    m.render()  # the same snapshot twice adds nothing
    assert value(m, "eagle_spec_decode_num_drafts_total") == 5
    assert value(m, "eagle_spec_decode_num_draft_tokens_total") == 35
    assert value(m, "eagle_spec_decode_num_accepted_tokens_total") == 6
    assert value(m, "eagle_num_preemptions_total") == 1
    assert value(m, "eagle_prefix_cache_queries_total") == 500
    assert value(m, "eagle_prefix_cache_hits_total") == 320
    per_pos = [
        value(m, "eagle_spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
        for p in range(3)
    ]
    assert per_pos == [4, 2, 0]
    # Positions past the tree's depth can never count anything: not exported.
    assert 'position="3"' not in m.render().decode()
    assert value(m, "eagle_spec_decode_fallback_total", reason="token_budget") == 2
    assert value(m, "eagle_spec_decode_fallback_total", reason="length_cap") == 1
    assert value(m, "eagle_kv_cache_usage_perc") == 0.25
    # A context lookup chain reaches further than the head's tree.
    m, client = make_metrics(engine=stub_engine(depth=3, lookup=5))
    client.engine_stats = spec_stats(2, 14, 3, [2, 1, 0, 0, 0, 0, 0])
    text = m.render().decode()
    assert 'position="4"' in text and 'position="5"' not in text


def test_the_speculation_policy_exports_its_choice_and_cost_model():
    from eagle_core.spec.policy import Candidate, SpeculationPolicy, StepCosts

    policy = SpeculationPolicy(StepCosts({1: 0.020, 4: 0.024}, {1: 0.010, 4: 0.040}), max_tree_nodes=2)
    policy.choose([Candidate("a", True, head=True)])
    m, client = make_metrics(engine=stub_engine())
    client.engine_stats = {**spec_stats(0, 0, 0, [0] * 7), "spec_policy": policy.as_dict()}
    m.render()
    assert value(m, "eagle_spec_policy_drafting_sequences") == 1
    assert value(m, "eagle_spec_policy_tree_tokens") == 2
    assert value(m, "eagle_spec_policy_expected_tokens_per_second") == pytest.approx(2 / (policy.costs.plain(2) + 0.010))
    assert value(m, "eagle_spec_policy_step_seconds", kind="plain", batch="4") == 0.024
    assert value(m, "eagle_spec_policy_step_seconds", kind="draft", batch="1") == 0.010
    assert value(m, "eagle_spec_policy_head_acceptance", sampling="greedy", tree_tokens="2") == 1.0
    assert value(m, "eagle_spec_policy_feed_seconds") == 0.0


def test_a_plain_engine_exports_no_positions_and_an_info_without_draft():
    m, client = make_metrics(engine=stub_engine(draft=None))
    client.engine_stats = spec_stats(0, 0, 0, [0] * 15)
    text = m.render().decode()
    assert "eagle_spec_decode_num_accepted_tokens_per_pos_total{" not in text
    assert value(m, "eagle_spec_decode_num_drafts_total") == 0


def test_model_info_names_model_draft_dtype_device_and_tree():
    m, _ = make_metrics(engine=stub_engine(lookup=4))
    m.render()
    families = {f.name: f for f in text_string_to_metric_families(m.render().decode())}
    (sample,) = families["eagle_model_info"].samples
    assert sample.name == "eagle_model_info" and sample.value == 1
    assert sample.labels == {
        "model_name": M,
        "model": "org/tiny-llama",
        "draft": "/heads/tiny",
        "dtype": "float32",
        "device": "cpu",
        "tree": "num_draft_tokens=8,depth=3,top_k=2,lookup_tokens=4",
        "draft_weights": "int8",
    }
    assert model_info(stub_engine(draft=None))["tree"] == "none"
    assert model_info(stub_engine(draft=None))["draft_weights"] == "none"


def test_nothing_engine_related_is_exported_before_the_engine_loads():
    m, _ = make_metrics(engine=None)
    text = m.render().decode()
    assert "eagle_num_requests_running{" not in text and "eagle_model_info{" not in text


# ---------------------------------------------------------------- buckets


def edges_per_decade(buckets, low: float, high: float) -> list[int]:
    decades = range(round(math.log10(low)), round(math.log10(high)))
    return [sum(10**d < b <= 10 ** (d + 1) for b in buckets) for d in decades]


@pytest.mark.parametrize(
    "buckets",
    [TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS, REQUEST_LATENCY_BUCKETS, QUEUE_TIME_BUCKETS,
     TOKEN_COUNT_BUCKETS, ACCEPTANCE_LENGTH_BUCKETS],
)  # fmt: skip
def test_buckets_increase_strictly(buckets):
    assert all(a < b for a, b in zip(buckets, buckets[1:]))


def test_token_latency_buckets_resolve_gpu_and_cpu_speeds():
    """Per-token latency: ~1 ms (GPU with speculation) to ~1 s (CPU, large batch): at least
    three edges in every decade between, and room above and below."""
    assert min(edges_per_decade(TOKEN_LATENCY_BUCKETS, 1e-3, 1.0)) >= 3
    assert TOKEN_LATENCY_BUCKETS[0] < 1e-3 and TOKEN_LATENCY_BUCKETS[-1] >= 5


def test_ttft_buckets_span_a_gpu_prefill_to_a_queued_cpu_request():
    assert min(edges_per_decade(TTFT_BUCKETS, 1e-2, 10.0)) >= 3
    assert TTFT_BUCKETS[0] <= 1e-3 and TTFT_BUCKETS[-1] >= 60


def test_ttft_alert_threshold_is_a_bucket_edge():
    """histogram_quantile interpolates inside a bucket; at an edge the alert's `> 5` compares
    against counted samples, not an interpolation."""
    rules = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())["groups"][0]
    (rule,) = [r for r in rules["rules"] if r["alert"] == "EagleTimeToFirstTokenHigh"]
    threshold = float(re.search(r">\s*([\d.]+)\s*$", rule["expr"].strip()).group(1))
    assert threshold in TTFT_BUCKETS


def test_request_and_queue_buckets():
    assert min(edges_per_decade(REQUEST_LATENCY_BUCKETS, 0.1, 100.0)) >= 3
    assert REQUEST_LATENCY_BUCKETS[-1] >= 600  # long CPU generations
    assert min(edges_per_decade(QUEUE_TIME_BUCKETS, 1e-3, 10.0)) >= 3


def test_acceptance_length_buckets_are_the_integers():
    """An acceptance length is an integer 1..depth+1 (or lookup_tokens+1): one edge per integer makes each bucket
    hold exactly one value, so the heatmap shows the true distribution."""
    assert ACCEPTANCE_LENGTH_BUCKETS == tuple(float(k) for k in range(1, 17))
    longest = max(SPEC_DEFAULTS.depth, SPEC_DEFAULTS.lookup_tokens)
    assert longest + 1 <= ACCEPTANCE_LENGTH_BUCKETS[-1]


def test_token_count_buckets_reach_long_contexts():
    assert TOKEN_COUNT_BUCKETS[:4] == (1.0, 2.0, 5.0, 10.0)
    assert TOKEN_COUNT_BUCKETS[-1] >= 128_000


# ---------------------------------------------------------------- failure reasons


def server_error_codes() -> set[str]:
    """Codes of server/errors.py's constructors that answer 5xx or 429 (503 model_loading and
    server_shutdown are never counted: the app does not record them)."""
    made = [
        errors.queue_full(1),
        errors.not_ready(1),
        errors.shutting_down(1),
        errors.engine_failed(),
        errors.internal_error(),
        errors.bad_request("x"),
        errors.model_not_found("x"),
    ]
    return {e.code for e in made if (e.status >= 500 or e.status == 429) and e.code not in errors.NOT_FAILURES}


def test_server_failure_reasons_match_errors_alert_and_dashboard():
    assert set(SERVER_FAILURE_REASONS) == server_error_codes()
    regex = 'reason=~"' + "|".join(SERVER_FAILURE_REASONS) + '"'
    alerts = yaml.safe_load((REPO / "deploy/prometheus/alerts.yml").read_text())
    (rule,) = [r for r in alerts["groups"][0]["rules"] if r["alert"] == "EagleErrorRateHigh"]
    assert rule["expr"].count("eagle_request_failure_total") == rule["expr"].count(regex) == 4
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/eagle-serve.json").read_text())
    (stat,) = [p for p in dashboard["panels"] if p["title"] == "Server error rate"]
    expr = stat["targets"][0]["expr"]
    assert expr.count("eagle_request_failure_total") == expr.count(regex) == 2


# ---------------------------------------------------------------- through the app


async def scrape(http) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + json.dumps({k: v for k, v in s.labels.items() if k != "model_name"})
            samples[key] = s.value
    return samples


async def test_streamed_chunks_are_timed_per_choice():
    _, client, http = await make_server()
    await client.wait_ready()
    try:
        body = {"prompt": "p", "max_tokens": 6, "n": 2, "stream": True}
        resp = await http.post("/v1/completions", json=body)
        chunks = [
            json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")
        ]
        content = [c for c in chunks if c["choices"][0]["text"]]
        per_choice = [sum(c["choices"][0]["index"] == i for c in content) for i in range(2)]
        samples = await scrape(http)
        # The gaps between the content chunks of each choice: chunks - 1 per choice.
        assert samples["eagle_inter_chunk_latency_seconds_count{}"] == sum(per_choice) - 2
        # FakeEngine emits 2 tokens per step: 6 tokens per choice -> 3 deliveries, 2 gaps of
        # 2 tokens each -> 4 per-token samples per choice.
        assert samples["eagle_inter_token_latency_seconds_count{}"] == 8
        assert samples["eagle_time_to_first_token_seconds_count{}"] == 2
        assert samples["eagle_generation_tokens_total{}"] == 12
    finally:
        await http.aclose()
        client.shutdown()


async def test_an_engine_failure_inside_a_stream_is_a_server_failure():
    engine, client, http = await make_server()
    await client.wait_ready()
    engine.step_delay = 0.01

    async def fail_soon():
        await asyncio.sleep(0.05)
        engine.fail_next_step = "boom"

    try:
        task = asyncio.create_task(fail_soon())
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
        resp = await http.post("/v1/chat/completions", json=body)
        await task
        assert resp.status_code == 200 and "internal_error" in resp.text
        samples = await scrape(http)
        assert samples['eagle_request_failure_total{"reason": "internal_error"}'] == 1
        # the finish-reason series exist from the start (at zero) and stay there
        assert {v for k, v in samples.items() if k.startswith("eagle_request_success_total")} == {0}
        assert samples["eagle_num_requests_running{}"] == 0
    finally:
        await http.aclose()
        client.shutdown()


async def test_client_errors_keep_their_reason():
    _, client, http = await make_server()
    await client.wait_ready()
    try:
        await http.post("/v1/completions", json={"prompt": "p", "model": "nope"})
        await http.post("/v1/completions", json={"prompt": "p", "max_tokens": -1})
        samples = await scrape(http)
        assert samples['eagle_request_failure_total{"reason": "model_not_found"}'] == 1
        assert samples['eagle_request_failure_total{"reason": "invalid_value"}'] == 1
        # the server's failure reasons exist from the start, at zero: client errors are not theirs
        for reason in SERVER_FAILURE_REASONS:
            assert samples[f'eagle_request_failure_total{{"reason": "{reason}"}}'] == 0
    finally:
        await http.aclose()
        client.shutdown()
