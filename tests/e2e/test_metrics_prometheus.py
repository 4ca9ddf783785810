"""A real Prometheus scrapes the real server while requests run; then every PromQL expression of
the Grafana dashboard and of the alert rules is evaluated through Prometheus' HTTP API.

All must parse and evaluate without error, and the core panels (throughput, TTFT, ITL,
inter-chunk and end-to-end latency, running/waiting, KV usage, acceptance length and rate) must
return data. Prometheus also loads deploy/prometheus/alerts.yml and evaluates every rule
without error, and `promtool check metrics` accepts the server's /metrics text.

Prometheus comes from Debian's `prometheus` package (`.ci/run` installs it); without it the
Prometheus tests are skipped. It listens on loopback only, keeps its TSDB in a temporary folder
and is killed at the end.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.server_process import REPO, ServerProcess, free_port
from tests.e2e.test_metrics_counts import metrics_server, request_mix, run_requests

sys.path.insert(0, str(REPO / "tests" / "deploy"))
from promql import dashboard_and_alert_exprs  # noqa: E402

pytestmark = pytest.mark.e2e

SCRAPE_INTERVAL_S = 1
ALERTS = REPO / "deploy/prometheus/alerts.yml"
# Dashboard panels that must show data after a few requests ("dashboard:<title>/<refId>").
CORE_PANELS = (
    "Generation tokens/s",
    "Token throughput",
    "Time to first token",
    "Inter-token latency",
    "Inter-chunk latency (streaming)",
    "End-to-end request latency",
    "Running and waiting requests",
    "KV cache usage",
    "Mean acceptance length",
    "Acceptance length",
    "Draft acceptance rate",
)
INSTALL_HINT = "apt-get install -y prometheus (Debian's package; .ci/run installs it)"


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, tiny_llama_dir) -> ServerProcess:
    return metrics_server(request, tmp_path_factory, tiny_llama_dir)


class Prometheus:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path):
        self.url = url
        self.proc = proc
        self.log = log

    def api(self, path: str, **params: str) -> dict:
        resp = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.api("query", query=expr, time=f"{time.time():.3f}")
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def wait_for(self, expr: str, predicate, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr} never satisfied: {result}\n{self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


def values(result: list[dict]) -> list[float]:
    return [float(sample["value"][1]) for sample in result]


@pytest.fixture(scope="module")
def prometheus(server: ServerProcess, tmp_path_factory) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(f"prometheus not found; {INSTALL_HINT}")
    root = tmp_path_factory.mktemp("prometheus")
    target = server.url.removeprefix("http://")
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
        },
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "eagle", "static_configs": [{"targets": [target]}]},
        ],
    }
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = root / "prometheus.log"
    cmd = [
        binary,
        f"--config.file={root / 'prometheus.yml'}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=root, start_new_session=True
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited with {proc.returncode}:\n{prom.log_tail()}")
            try:
                if httpx.get(prom.url + "/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready after 60 s:\n{prom.log_tail()}")
            time.sleep(0.2)
        yield prom
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def generate_load(server: ServerProcess, prometheus: Prometheus) -> None:
    """Requests in two waves with scrapes in between, so that every series exists at one scrape
    and has risen at a later one, inside the dashboards' 1m rate window."""
    prometheus.wait_for('up{job="eagle"}', lambda r: values(r) == [1.0])
    for wave in range(2):
        run_requests(server, request_mix(wave))
        time.sleep(2.5 * SCRAPE_INTERVAL_S)
    # Wait until Prometheus holds the final count, so nothing is judged on a stale scrape.
    final = httpx.get(server.url + "/metrics", timeout=10).text
    (line,) = [ln for ln in final.splitlines() if ln.startswith("eagle_generation_tokens_total{")]
    total = float(line.rsplit(" ", 1)[1])
    prometheus.wait_for(
        "sum(eagle_generation_tokens_total)", lambda r: values(r) == [total], timeout=15
    )


def test_dashboard_and_alert_queries_on_a_live_prometheus(server, prometheus):
    generate_load(server, prometheus)
    exprs = dashboard_and_alert_exprs(REPO)
    sources = {source.split("/")[0] for source, _ in exprs}
    assert {s for s in sources if s.startswith("alerts:")}, "no alert expression found"
    empty_core, failed = [], []
    for source, expr in exprs:
        try:
            result = prometheus.query(expr)
        except AssertionError as exc:  # a parse or evaluation error: report them all at once
            failed.append(f"{source}: {exc}")
            continue
        panel = source.removeprefix("dashboard:").rsplit("/", 1)[0]
        if source.startswith("dashboard:") and panel in CORE_PANELS:
            if not [v for v in values(result) if not math.isnan(v)]:
                empty_core.append(f"{source}: {expr} -> {result}")
    assert not failed, "\n".join(failed)
    assert not empty_core, "core panels without data:\n" + "\n".join(empty_core)
    covered = {s.removeprefix("dashboard:").rsplit("/", 1)[0] for s, _ in exprs}
    assert set(CORE_PANELS) <= covered, set(CORE_PANELS) - covered


def test_prometheus_loads_and_evaluates_the_alert_rules(server, prometheus):
    rules_file = yaml.safe_load(ALERTS.read_text())
    expected = {r["alert"] for g in rules_file["groups"] for r in g["rules"]}

    def evaluated() -> list[dict]:
        groups = prometheus.api("rules")["groups"]
        return [r for g in groups for r in g["rules"]]

    # Each rule is evaluated once per evaluation_interval; "unknown" means not evaluated yet.
    deadline = time.monotonic() + 20
    rules = evaluated()
    while any(r["health"] == "unknown" for r in rules) and time.monotonic() < deadline:
        time.sleep(0.5)
        rules = evaluated()
    assert {r["name"] for r in rules} == expected
    for rule in rules:
        assert rule["health"] == "ok", rule
    # The server is up and fails nothing. (Latency and acceptance alerts may well be pending:
    # a tiny model on a busy shared CPU, half of its traffic sampled, is slow and accepts little.)
    state = {r["name"]: r["state"] for r in rules}
    assert state["EagleServeDown"] == state["EagleErrorRateHigh"] == "inactive", state


def test_promtool_accepts_the_metrics_text(server):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(f"promtool not found; {INSTALL_HINT}")
    run_requests(server, request_mix(0)[:2])  # so every histogram and counter has a sample
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert "eagle_spec_decode_acceptance_length_bucket" in text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (result.stdout + result.stderr).strip(), result.stdout + result.stderr
