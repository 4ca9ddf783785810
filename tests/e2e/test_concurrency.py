"""Many clients at once, and clients that leave: the real server on SmolLM2."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.e2e.server_process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NUM_CLIENTS = 32
MAX_TOKENS = 12
TOPICS = [
    "cats", "rivers", "bread", "stars", "trains", "music", "winter", "coffee",
    "forests", "chess", "rain", "bicycles", "oceans", "books", "mountains", "gardens",
]  # fmt: skip


def prompt(i: int) -> str:
    return f"Write one sentence about {TOPICS[i % len(TOPICS)]} (note {i})."


async def stream_chat(http: httpx.AsyncClient, i: int) -> tuple[str, dict]:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": prompt(i)}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, usage = "", {}
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"]:
                text += chunk["choices"][0]["delta"].get("content") or ""
            if chunk.get("usage"):
                usage = chunk["usage"]
    return text, usage


def wait_for_metric(server: ServerProcess, name: str, value: float, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.metric(name) == value:
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} did not reach {value}: {server.metric(name)}")


def test_32_concurrent_streams_are_batched_and_correct(smollm2_server: ServerProcess):
    async def run_all():
        async with httpx.AsyncClient(base_url=smollm2_server.url, timeout=300) as http:
            return await asyncio.gather(*(stream_chat(http, i) for i in range(NUM_CLIENTS)))

    results = asyncio.run(run_all())
    # The engine ran them together, not one after another.
    peak = smollm2_server.metric("eagle_num_requests_running_peak")
    assert peak >= NUM_CLIENTS // 2, peak
    # Each stream carries its own prompt's answer: the same text as the prompt alone
    # (fp32 greedy), checked for a sample of clients to keep the test short on a CPU.
    for i in (0, 1, 7, 16, 31):
        resp = httpx.post(
            smollm2_server.url + "/v1/chat/completions",
            json={
                "model": "smollm2",
                "messages": [{"role": "user", "content": prompt(i)}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
            },
            timeout=120,
        ).json()
        text, usage = results[i]
        assert text == resp["choices"][0]["message"]["content"], i
        # The same counts, except what the prefix cache served (the resend finds the stream's blocks)
        streamed_details, details = usage.pop("prompt_tokens_details"), resp["usage"].pop("prompt_tokens_details")
        assert usage == resp["usage"]
        assert 0 <= streamed_details["cached_tokens"] <= details["cached_tokens"] < usage["prompt_tokens"]
    assert all(text and usage["completion_tokens"] >= 1 for text, usage in results)
    wait_for_metric(smollm2_server, "eagle_num_requests_running", 0)


def test_disconnect_mid_stream_aborts_and_server_carries_on(smollm2_server: ServerProcess):
    aborted_before = smollm2_server.metric("eagle_request_success_total", finished_reason="abort")
    body = {
        "model": "smollm2",
        "prompt": "Here is a very long story about a dragon:",
        "max_tokens": 2000,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=smollm2_server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            seen = 0
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    seen += 1
                if seen == 3:
                    break  # leaving the block closes the connection mid-stream
    assert smollm2_server.metric("eagle_num_requests_running") <= 1
    wait_for_metric(smollm2_server, "eagle_num_requests_running", 0, timeout=10)
    aborted = smollm2_server.metric("eagle_request_success_total", finished_reason="abort")
    assert aborted == aborted_before + 1
    # The next request is served normally.
    resp = httpx.post(
        smollm2_server.url + "/v1/completions",
        json={"model": "smollm2", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
        timeout=60,
    )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
