"""Raw HTTP as curl sends it (no SDK), and the command line itself."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from tests.e2e.server_process import REPO, ServerProcess, free_port

pytestmark = pytest.mark.e2e


def curl_post(url: str, body: dict) -> httpx.Response:
    # `curl -d '{...}'` without -H sends this Content-Type; the server must still read JSON.
    return httpx.post(
        url,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "curl/8.5.0"},
        timeout=120,
    )


@pytest.mark.slow
def test_curl_chat_and_completion(smollm2_server: ServerProcess):
    resp = curl_post(
        smollm2_server.url + "/v1/chat/completions",
        {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8},
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"]
    assert set(body["choices"][0]["spec_decode"]) == {
        "num_steps", "num_draft_tokens", "num_accepted_tokens", "mean_acceptance_length",
    }  # fmt: skip
    # `model` may be omitted from a hand-written request.
    resp = curl_post(smollm2_server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert resp.status_code == 200 and resp.json()["model"] == "smollm2"


@pytest.mark.slow
def test_curl_stream_wire_format(smollm2_server: ServerProcess):
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 10,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", smollm2_server.url + "/v1/chat/completions", json=body, timeout=120
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == ""  # every event ends with a blank line
    events = [e for e in events[:-1] if not e.startswith(":")]  # ":" lines are keep-alive pings
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(final) == 1 and "spec_decode" in final[0]["choices"][0]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] <= 10


@pytest.mark.slow
def test_tokenize_models_health_metrics(smollm2_server: ServerProcess):
    url = smollm2_server.url
    tok = curl_post(url + "/tokenize", {"model": "smollm2", "prompt": "Hello world"}).json()
    assert tok["count"] == len(tok["tokens"]) >= 2
    chat_tok = curl_post(url + "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
    # /tokenize counts what usage.prompt_tokens counts.
    resp = curl_post(
        url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    )
    assert chat_tok.json()["count"] == resp.json()["usage"]["prompt_tokens"]
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    models = httpx.get(url + "/v1/models").json()
    assert models["data"][0]["id"] == "smollm2" and models["data"][0]["max_model_len"] > 0
    metrics = httpx.get(url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "# TYPE eagle_generation_tokens_total counter" in metrics.text
    assert smollm2_server.metric("eagle_generation_tokens_total", model_name="smollm2") > 0


def test_help_lists_flags_and_defaults():
    out = subprocess.run(
        [sys.executable, "-m", "server", "--help"], cwd=REPO, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0
    for flag in ("--host", "--port", "--model", "--api-key", "--config", "--no-speculation",
                 "--max-num-seqs", "--kv-cache-tokens", "--allowed-origins"):  # fmt: skip
        assert flag in out.stdout
    assert "(default: '127.0.0.1')" in out.stdout


def test_bad_flag_exits_2_and_failed_load_exits_1(tmp_path):
    bad = subprocess.run(
        [sys.executable, "-m", "server", "--port", "notaport"], cwd=REPO, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "port" in bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "server", "--model", str(tmp_path / "no-such-model"),
         "--port", str(free_port()), "--device", "cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "failed to load" in missing.stderr
