"""The real server's /metrics move as they should: after a mix of requests (chat and
completions, streamed and not, greedy and sampled, concurrent) the counters rise by exactly what
the responses report, the speculation counters are consistent with each other, and the gauges
return to idle.

The server runs a tiny "bigram" target with an oracle EAGLE head (tests/spec_helpers.py): greedy
drafts are always right and sampled ones often wrong, so acceptance lengths and per-position
counts are non-trivial. `metrics_server()` starts it once per session for this file and
test_metrics_prometheus.py.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.server_process import ServerProcess, start_server, stop_server

pytestmark = pytest.mark.e2e

MODEL = "tiny-oracle"
NUM_DRAFT_TOKENS, DEPTH, TOP_K = 8, 3, 2  # no context lookup: the depth counts below are the head's
_CONFIG_ATTR = "_eagle_metrics_test_server"  # one server per session, shared by two files


def metrics_server(request, tmp_path_factory, tiny_llama_dir: Path) -> ServerProcess:
    """Start (once per session) the oracle-head server; stopped when the session ends."""
    server = getattr(request.config, _CONFIG_ATTR, None)
    if server is None:
        from tests.spec_helpers import bigram_target_dir, oracle_head_dir

        root = tmp_path_factory.mktemp("metrics_server")
        target = bigram_target_dir(tiny_llama_dir, root / "target")
        head = oracle_head_dir(target, root / "oracle")
        args = ["--model", str(target), "--draft", str(head), "--served-model-name", MODEL,
                "--num-draft-tokens", str(NUM_DRAFT_TOKENS), "--draft-depth", str(DEPTH),
                "--draft-top-k", str(TOP_K), "--lookup-tokens", "0", "--spec-max-batch", "0", "--device", "cpu", "--dtype", "float32",
                "--max-num-seqs", "4"]  # fmt: skip
        server = start_server(args, root / "server.log")
        setattr(request.config, _CONFIG_ATTR, server)
        request.config.add_cleanup(lambda: stop_server(server))
    return server


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, tiny_llama_dir) -> ServerProcess:
    return metrics_server(request, tmp_path_factory, tiny_llama_dir)


# ---------------------------------------------------------------- scraping


class Scrape:
    """One /metrics read: samples by (name, labels without model_name)."""

    def __init__(self, text: str):
        self.text = text
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                assert s.labels.get("model_name") == MODEL, s
                labels = frozenset((k, v) for k, v in s.labels.items() if k != "model_name")
                self.samples[(s.name, labels)] = s.value

    def get(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        return {
            dict(ls)[label]: v
            for (n, ls), v in self.samples.items()
            if n == name and label in dict(ls)
        }


def scrape(server: ServerProcess) -> Scrape:
    return Scrape(httpx.get(server.url + "/metrics", timeout=10).text)


def wait_idle(server: ServerProcess, timeout: float = 30) -> Scrape:
    deadline = time.monotonic() + timeout
    while True:
        now = scrape(server)
        idle = now.get("eagle_num_requests_running") == 0 and not now.get(
            "eagle_num_requests_waiting"
        )
        if idle or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


# ---------------------------------------------------------------- requests


def _post(server: ServerProcess, path: str, body: dict) -> dict:
    """One request; returns {prompt_tokens, completion_tokens, finish_reason} (streams too)."""
    url = server.url + path
    if not body.get("stream"):
        resp = httpx.post(url, json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        data = resp.json()
        return {**data["usage"], "finish_reason": data["choices"][0]["finish_reason"]}
    body = {**body, "stream_options": {"include_usage": True}}
    finish, usage = None, None
    with httpx.stream("POST", url, json=body, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                finish = choice.get("finish_reason") or finish
    assert usage is not None and finish is not None
    return {**usage, "finish_reason": finish}


def request_mix(round_: int) -> list[tuple[str, dict]]:
    """Chat and completions, streamed and not, greedy (drafts all accepted) and sampled."""
    chat = [{"role": "user", "content": f"Tell me about metrics, round {round_}."}]
    prompt = f"The quick brown fox {round_}"
    return [
        ("/v1/completions", {"prompt": prompt, "max_tokens": 20, "temperature": 0,
                             "ignore_eos": True}),
        ("/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 1.0,
                             "seed": round_, "ignore_eos": True, "stream": True}),
        ("/v1/chat/completions", {"messages": chat, "max_tokens": 12, "temperature": 0}),
        ("/v1/chat/completions", {"messages": chat, "max_tokens": 14, "temperature": 0.8,
                                  "seed": 7 + round_, "stream": True}),
        ("/v1/completions", {"prompt": prompt, "max_tokens": 2, "temperature": 0,
                             "ignore_eos": True}),
    ]  # fmt: skip


def run_requests(server: ServerProcess, requests: Iterable[tuple[str, dict]]) -> list[dict]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(_post, server, path, {"model": MODEL, **body})
                   for path, body in requests]  # fmt: skip
        return [f.result() for f in futures]


# ---------------------------------------------------------------- the test


def test_metrics_move_with_the_requests(server: ServerProcess):
    before = wait_idle(server)
    results = run_requests(server, [r for i in range(2) for r in request_mix(i)])
    bad = httpx.post(server.url + "/v1/completions", json={"model": "nope", "prompt": "x"})
    assert bad.status_code == 404
    after = wait_idle(server)

    def delta(name: str, **labels: str) -> float:
        return after.get(name, **labels) - before.get(name, **labels)

    n = len(results)
    completion_tokens = sum(r["completion_tokens"] for r in results)
    prompt_tokens = sum(r["prompt_tokens"] for r in results)
    # Tokens: exactly what the responses' usage says.
    assert delta("eagle_generation_tokens_total") == completion_tokens
    assert delta("eagle_prompt_tokens_total") == prompt_tokens
    assert delta("eagle_request_generation_tokens_sum") == completion_tokens
    assert delta("eagle_request_prompt_tokens_sum") == prompt_tokens
    # One success per finished choice, by finish reason; the 404 is a client error.
    for reason, count in Counter(r["finish_reason"] for r in results).items():
        assert delta("eagle_request_success_total", finished_reason=reason) == count, reason
    assert delta("eagle_request_success_total") == n
    assert delta("eagle_request_failure_total", reason="model_not_found") == 1
    assert delta("eagle_request_failure_total", reason="internal_error") == 0
    # One sample per request for the per-request histograms.
    for name in (
        "eagle_time_to_first_token_seconds",
        "eagle_e2e_request_latency_seconds",
        "eagle_request_queue_time_seconds",
        "eagle_request_generation_tokens",
    ):
        assert delta(f"{name}_count") == n, name
    # Per-token ITL: one sample per token after each request's first delivery.
    itl = delta("eagle_inter_token_latency_seconds_count")
    assert 0 < itl <= completion_tokens - n
    assert delta("eagle_inter_chunk_latency_seconds_count") > 0  # streams were timed

    # Speculation: accepted <= drafted; one acceptance-length sample per verified tree whose
    # value is accepted + 1; the per-position counts fall with depth and add up to accepted.
    drafts = delta("eagle_spec_decode_num_drafts_total")
    drafted = delta("eagle_spec_decode_num_draft_tokens_total")
    accepted = delta("eagle_spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 0 < accepted <= drafted
    assert delta("eagle_spec_decode_acceptance_length_count") == drafts
    assert delta("eagle_spec_decode_acceptance_length_sum") == accepted + drafts
    # The oracle's greedy drafts are right: some steps accept the whole depth.
    full_depth = drafts - delta("eagle_spec_decode_acceptance_length_bucket", le=f"{DEPTH}.0")
    assert full_depth > 0
    per_pos_name = "eagle_spec_decode_num_accepted_tokens_per_pos_total"
    per_pos_before = before.by_label(per_pos_name, "position")
    per_pos = {
        int(p): v - per_pos_before.get(p, 0)
        for p, v in after.by_label(per_pos_name, "position").items()
    }
    assert sorted(per_pos) == list(range(DEPTH))
    counts = [per_pos[p] for p in range(DEPTH)]
    assert all(a >= b for a, b in zip(counts, counts[1:])), counts
    assert counts[0] <= drafts and sum(counts) == accepted
    # max_tokens=2: the second token's decode step has no room for a draft.
    assert delta("eagle_spec_decode_fallback_total", reason="length_cap") >= 2

    # Gauges back to idle; the info metric says what runs.
    assert after.get("eagle_num_requests_running") == 0
    assert after.get("eagle_num_requests_waiting") == 0
    assert after.get("eagle_kv_cache_usage_perc") == 0
    assert after.get("eagle_num_requests_running_peak") > 1  # the thread pool was batched
    ((_, labels),) = [k for k in after.samples if k[0] == "eagle_model_info"]
    info = dict(labels)
    assert info["draft"].endswith("oracle") and info["dtype"] == "float32"
    assert info["device"] == "cpu" and info["draft_weights"] == "float32"  # int8 is for bf16 models
    assert info["tree"] == f"num_draft_tokens={NUM_DRAFT_TOKENS},depth={DEPTH},top_k={TOP_K},lookup_tokens=0"
