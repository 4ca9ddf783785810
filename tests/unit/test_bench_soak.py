"""bench.soak without the real model: the request plan, the RSS summary, the reconciliation of
the client's and the server's counts, and a short soak against the app over FakeEngine."""

from __future__ import annotations

import httpx
import pytest

from bench import soak
from server.app import create_app
from server.engine_client import EngineClient
from server.settings import ServerSettings

try:
    from tests.unit.test_server_fake_engine import FakeEngine
except ImportError:  # pytest's rootdir-relative import mode
    from test_server_fake_engine import FakeEngine

PROMPTS = ["Say hi.", "Count to three.", "Name a colour."]


def test_plan_is_reproducible_and_mixed():
    requests = soak.plan(2000, PROMPTS, seed=3, max_tokens=(8, 48))
    assert requests == soak.plan(2000, PROMPTS, seed=3, max_tokens=(8, 48))
    assert [r.index for r in requests] == list(range(2000))
    valid = [r for r in requests if r.invalid is None]
    invalid = [r for r in requests if r.invalid is not None]
    assert 20 < len(invalid) < 100 and {r.invalid for r in invalid} == set(soak.INVALID_KINDS)
    assert all(r.choices == 0 and not r.stream for r in invalid)
    paths = {r.path for r in valid}
    assert paths == {"/v1/chat/completions", "/v1/completions"}
    assert 0.4 < sum(r.stream for r in valid) / len(valid) < 0.6
    assert all(8 <= r.body["max_tokens"] <= 48 for r in valid)
    assert any(r.choices == 2 for r in valid) and any("stop" in r.body for r in valid)
    assert any("seed" in r.body for r in valid) and any("logprobs" in r.body for r in valid)
    cancelled = [r for r in valid if r.cancel]
    assert cancelled and all(r.stream and r.choices == 1 for r in cancelled)
    for r in valid:  # the choices the server will run for it
        expected = r.body.get("n", 1) * (len(r.body["prompt"]) if isinstance(r.body.get("prompt"), list) else 1)
        assert r.choices == expected


def test_rss_summary_marks_each_window_and_the_end():
    samples = [{"t_s": 5.0 * i, "requests_done": 50 * i, "rss_mb": 1000.0 + 10 * min(i, 6)} for i in range(14)]
    samples.insert(3, {"t_s": 12.0, "requests_done": 140, "rss_mb": None})  # process gone: skipped
    summary = soak.rss_summary(samples, window=300)
    assert [m["requests"] for m in summary["by_requests"]] == [0, 300, 600, 650]
    assert [m["rss_mb"] for m in summary["by_requests"]] == [1000.0, 1060.0, 1060.0, 1060.0]
    assert [m.get("growth_mb") for m in summary["by_requests"]] == [None, 60.0, 0.0, 0.0]
    assert summary["start_mb"] == 1000.0 and summary["end_mb"] == 1060.0 and summary["peak_mb"] == 1060.0
    assert summary["growth_mb"] == 60.0 and summary["second_half_growth_mb"] == 0.0
    assert soak.rss_summary([], 300)["by_requests"] == []


def _metrics(stop=0, length=0, abort=0, failures=None, tokens=0, running=0):
    model = (("model_name", "m"),)
    samples = {
        ("eagle_request_success_total", tuple(sorted((*model, ("finished_reason", "stop"))))): stop,
        ("eagle_request_success_total", tuple(sorted((*model, ("finished_reason", "length"))))): length,
        ("eagle_request_success_total", tuple(sorted((*model, ("finished_reason", "abort"))))): abort,
        ("eagle_generation_tokens_total", model): tokens,
        ("eagle_num_requests_running", model): running,
        ("eagle_num_requests_waiting", model): 0,
    }
    for reason, count in (failures or {}).items():
        samples[("eagle_request_failure_total", tuple(sorted((*model, ("reason", reason)))))] = count
    return samples


def _tally(**kw) -> dict:
    tally = soak.ClientTally(**kw)
    return {**tally.as_dict(), "error_codes": dict(tally.error_codes())}


def test_reconcile_agrees_when_nothing_is_lost():
    before = _metrics(stop=5, length=1, failures={"invalid_value": 2}, tokens=100)
    after = _metrics(stop=12, length=4, abort=2, failures={"invalid_value": 4, "model_not_found": 1}, tokens=400)
    server = soak.server_counts(before, after)
    assert server["finished"] == {"abort": 2, "length": 3, "stop": 7}
    assert server["failures"] == {"invalid_value": 2, "model_not_found": 1}
    assert server["generation_tokens"] == 300
    # 9 choices completed, 3 cancelled: one of those finished on the server first (raced)
    tally = _tally(sent=15, invalid_sent=3, completed=9, cancelled=3, choices_completed=9, choices_cancelled=3,
                   errors={"400 invalid_value": 2, "404 model_not_found": 1})
    checks = soak.reconcile(tally, server)
    assert all(c["ok"] for c in checks), checks


@pytest.mark.parametrize(
    ("after", "tally_kw", "failing"),
    [
        # a sequence the client never saw finish nor cancelled: lost
        (_metrics(stop=11), {"completed": 10, "choices_completed": 10, "sent": 10}, "sequences accepted"),
        # an abort nobody asked for
        (_metrics(stop=9, abort=1), {"completed": 10, "choices_completed": 10, "sent": 10}, "every abort"),
        # the server counted a failure the client never got
        (_metrics(stop=2, failures={"internal_error": 1}), {"completed": 2, "choices_completed": 2, "sent": 2},
         "errors by code"),
        (_metrics(stop=1, running=1), {"completed": 1, "choices_completed": 1, "sent": 1}, "running or waiting"),
        (_metrics(stop=1), {"completed": 1, "choices_completed": 1, "sent": 2, "unexpected": ["#1: cut"]},
         "unexpected"),
    ],
)
def test_reconcile_fails_when_something_is_lost(after, tally_kw, failing):
    checks = soak.reconcile(_tally(**tally_kw), soak.server_counts(_metrics(), after))
    failed = [c["check"] for c in checks if not c["ok"]]
    assert any(failing in name for name in failed), checks


def test_rss_of_this_process_is_read_from_proc():
    import os

    assert soak.rss_mb(os.getpid()) > 1
    assert soak.rss_mb(2**22 + 12345) is None  # no such process
    row = soak.sample(os.getpid(), started=0.0, done=7)
    assert row["requests_done"] == 7 and row["rss_mb"] > 1


async def test_a_short_soak_against_the_app_reconciles():
    """The client and the accounting end to end, in process: FakeEngine behind the real app."""
    engine = FakeEngine(max_model_len=512, max_num_seqs=4)
    client = EngineClient(lambda: engine, max_waiting=64)
    client.start()
    app = create_app(client, ServerSettings(served_model_name="fake-model"))
    await client.wait_ready()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    try:
        before = await soak.scrape(http, "")
        tally = soak.ClientTally()
        requests = soak.plan(150, PROMPTS, seed=1, max_tokens=(4, 12))
        await soak.run_clients(http, "", "fake-model", requests, clients=3, deadline=float("inf"), tally=tally)
        after = await soak.settled_metrics(http, "", timeout_s=5)
    finally:
        await http.aclose()
        client.shutdown()
    counts = {**tally.as_dict(), "error_codes": dict(tally.error_codes())}
    assert counts["sent"] == 150 and counts["invalid_sent"] > 0
    checks = soak.reconcile(counts, soak.server_counts(before, after))
    assert all(c["ok"] for c in checks), checks
