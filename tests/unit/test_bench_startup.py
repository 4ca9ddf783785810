"""bench.startup without the real server: one timed start of a stand-in server (ready, first
request, stopped afterwards), a start that fails, the report and the arguments."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from bench import startup
from bench.peers import Launch

FAKE_SERVER = Path(__file__).resolve().parents[1] / "fake_openai_server.py"


def test_time_start_measures_a_stand_in_server_and_stops_it(tmp_path):
    launch = Launch("fake", [sys.executable, str(FAKE_SERVER), "{port}", "usage"])
    row = asyncio.run(startup.time_start(launch, tmp_path / "fake.log", timeout_s=30))
    assert row["ready_s"] > 0 and row["first_request_s"] > 0
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", row["port"])) != 0  # stopped


def test_time_start_raises_when_the_server_exits(tmp_path):
    launch = Launch("broken", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    with pytest.raises(RuntimeError, match="exited \\(3\\)"):
        asyncio.run(startup.time_start(launch, tmp_path / "broken.log", timeout_s=30))


def test_markdown_has_a_row_per_configuration():
    results = {
        "machine": {"name": "m", "cpu": "Some CPU", "cpu_count": 2},
        "date": "2026-12-03",
        "settings": {"model": "smollm2", "machine": "m", "revision": "abc"},
        "configs": [
            {"name": "eagle", "flags": [], "cold": {"ready_s": 150.0, "first_request_s": 0.4},
             "warm": {"ready_s": 120.0, "first_request_s": 0.3}},
            {"name": "eager", "flags": ["--compile", "off"], "cold": {"ready_s": 9.0, "first_request_s": 0.5},
             "warm": {"ready_s": 8.5, "first_request_s": 0.5}},
        ],
    }
    text = startup.markdown(results)
    assert text.startswith("# Server start-up: m (Some CPU, 2 CPUs), 2026-12-03")
    assert "| eagle | `(defaults)` | 150.0 s | 0.4 s | 120.0 s | 0.3 s |" in text
    assert "| eager | `--compile off` | 9.0 s | 0.5 s | 8.5 s | 0.5 s |" in text


def test_parse_args_rejects_unknown_configurations():
    assert startup.parse_args(["--configs", "plain,eager"]).configs == ["plain", "eager"]
    with pytest.raises(SystemExit):
        startup.parse_args(["--configs", "eagle,fast"])
