"""The server with an EAGLE draft head (tiny model, random head): spec_decode figures reach
the client, and greedy text is the same as without speculation."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.server_process import ServerProcess

pytestmark = pytest.mark.e2e

PROMPTS = ["The quick brown fox", "Question: What is the capital of France?", "def fibonacci(n"]


def complete(server: ServerProcess, prompt: str, **extra) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, **extra}
    resp = httpx.post(server.url + "/v1/completions", json=body, headers=server.headers,
                      timeout=120)  # fmt: skip
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_spec_decode_is_reported(tiny_spec_server: ServerProcess):
    for prompt in PROMPTS:
        choice = complete(tiny_spec_server, prompt, ignore_eos=True)["choices"][0]
        spec = choice["spec_decode"]
        assert spec["num_steps"] >= 1
        assert spec["num_draft_tokens"] > 0  # the head drafted
        assert 0 <= spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
        assert spec["mean_acceptance_length"] >= 1.0


def test_greedy_text_matches_plain_decoding(tiny_spec_server, tiny_server):
    for prompt in PROMPTS:
        spec = complete(tiny_spec_server, prompt)["choices"][0]
        plain = complete(tiny_server, prompt)["choices"][0]
        assert spec["text"] == plain["text"], prompt
        assert plain["spec_decode"]["num_draft_tokens"] == 0
        assert plain["spec_decode"]["mean_acceptance_length"] in (0.0, 1.0)


def test_stream_final_chunk_carries_the_same_spec_decode(tiny_spec_server: ServerProcess):
    plain = complete(tiny_spec_server, PROMPTS[0], ignore_eos=True)["choices"][0]
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", tiny_spec_server.url + "/v1/completions", json=body,
                      timeout=120) as resp:  # fmt: skip
        lines = [ln[6:] for ln in resp.iter_lines() if ln.startswith("data: {")]
    chunks = [json.loads(ln) for ln in lines]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    finals = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert text == plain["text"]
    assert finals[0]["spec_decode"] == plain["spec_decode"]
