"""SIGTERM on the real server process: it drains (server/shutdown.py) and exits with status 0.
Every accepted request gets its whole answer or an explicit server_shutdown error, never a 500
or a cut connection; a request that arrives while it drains gets a 503 server_shutdown."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.e2e.server_process import start_server, stop_server

pytestmark = pytest.mark.e2e

TIMEOUT_S = 4.0


def assert_shutdown_error(resp: httpx.Response) -> None:
    assert resp.status_code == 503, resp.text
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert error["code"] == "server_shutdown" and error["type"] == "service_unavailable_error"


def test_sigterm_drains_running_requests_then_exits_0(tmp_path, tiny_llama_dir):
    server = start_server(
        [
            "--model", str(tiny_llama_dir), "--served-model-name", "tiny", "--device", "cpu",
            "--dtype", "float32", "--compile", "off", "--shutdown-timeout", str(TIMEOUT_S),
        ],
        tmp_path / "server.log",
        entry=[sys.executable, str(Path(__file__).with_name("slow_steps.py"))],
    )  # fmt: skip
    url = server.url + "/v1/completions"
    # 50 ms a step: the short request ends within the timeout, the long ones (400+ tokens) not.
    short = {"model": "tiny", "prompt": "Hello", "max_tokens": 20, "min_tokens": 20}
    long = {"model": "tiny", "prompt": "Hello", "max_tokens": 450, "min_tokens": 450}

    def stream(body: dict) -> list[str]:
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as resp:
            assert resp.status_code == 200
            return [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]

    try:
        with ThreadPoolExecutor(3) as pool:
            finishing = pool.submit(httpx.post, url, json=short, timeout=60)
            cut = pool.submit(httpx.post, url, json=long, timeout=60)
            cut_stream = pool.submit(stream, long)
            deadline = time.monotonic() + 30
            while server.metric("eagle_num_requests_running") < 3:
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.05)
            os.kill(server.proc.pid, signal.SIGTERM)
            time.sleep(0.5)
            assert_shutdown_error(httpx.post(url, json=short, timeout=10))
            assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "stopping"
            finished, cut_resp, events = finishing.result(), cut.result(), cut_stream.result()
        assert server.proc.wait(TIMEOUT_S + 20) == 0, server.log_tail()
    finally:
        stop_server(server)
    assert finished.status_code == 200, finished.text
    assert finished.json()["usage"]["completion_tokens"] == 20
    assert_shutdown_error(cut_resp)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "server_shutdown"
    log = server.log_path.read_text()
    assert "of 3 running requests 1 finished and 2 were cut at the 4 s deadline" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
