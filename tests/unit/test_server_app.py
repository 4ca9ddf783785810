"""The HTTP app against FakeEngine, in process (httpx ASGI transport): routes, shapes, errors."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from server.app import create_app
from server.engine_client import EngineClient
from server.protocol import ChatCompletionRequest, ChatMessage, TextPart
from server.settings import ServerSettings

try:
    from tests.unit.test_server_fake_engine import FakeEngine
except ImportError:  # pytest's rootdir-relative import mode
    from test_server_fake_engine import FakeEngine

REPLY = FakeEngine.REPLY


async def make_server(engine=None, factory=None, max_waiting=16, **settings):
    engine = engine or FakeEngine()
    client = EngineClient(factory or (lambda: engine), max_waiting=max_waiting)
    client.start()
    app = create_app(client, ServerSettings(served_model_name="fake-model", **settings))
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return engine, client, http


@pytest.fixture
async def server():
    engine, client, http = await make_server()
    await client.wait_ready()
    yield engine, client, http
    await http.aclose()
    client.shutdown()


def sse_data(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def chat(**kw):
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    body.update(kw)
    return body


def assert_error(resp: httpx.Response, status: int, param=None, code=None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


# ---------------------------------------------------------------- happy paths


async def test_chat_completion(server):
    engine, _, http = server
    resp = await http.post("/v1/chat/completions", json=chat(temperature=0))
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion" and body["model"] == "fake-model"
    assert body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": REPLY}
    assert choice["finish_reason"] == "stop"
    spec = choice["spec_decode"]
    assert spec["num_steps"] > 0 and spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(len(REPLY) / spec["num_steps"], rel=1e-3)
    prompt_len = len("user: hi\nassistant: ")
    assert body["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": len(REPLY),
        "total_tokens": prompt_len + len(REPLY),
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert engine.used_threads == 1


async def test_chat_content_parts_and_max_completion_tokens(server):
    _, _, http = server
    msgs = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    resp = await http.post(
        "/v1/chat/completions",
        json={"messages": msgs, "temperature": 0, "max_completion_tokens": 5},
    )
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == REPLY[:5]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len("system: be brief\nuser: ab\nassistant: ")


async def test_null_means_the_default_and_harmless_openai_fields_pass(server):
    """Clients send null for "not set"; tool_choice "none" and a text response_format ask for
    nothing this server lacks; min_tokens reaches the engine."""
    _, _, http = server
    body = chat(
        n=None, stream=None, logprobs=None, stream_options=None, user=None, max_tokens=3,
        response_format={"type": "text"}, tools=[{"type": "function", "function": {"name": "f"}}],
        tool_choice="none", min_tokens=2,
    )  # fmt: skip
    resp = await http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["choices"]) == 1 and resp.json()["usage"]["completion_tokens"] == 3
    resp = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "echo": None, "n": None})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
    # null is a value of max_tokens: no limit but the context (vLLM's reading), not 16
    resp = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": None, "temperature": 0})
    assert resp.json()["usage"]["completion_tokens"] > 16


async def test_completion_defaults_to_16_tokens_and_ignores_unknown_fields(server):
    _, _, http = server
    resp = await http.post(
        "/v1/completions",
        json={"model": "fake-model", "prompt": "x", "temperature": 0, "frobnicate": True},
    )
    body = resp.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == REPLY[:16]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 16


async def test_completion_batched_prompts_and_token_ids(server):
    _, _, http = server
    resp = await http.post(
        "/v1/completions",
        json={"prompt": ["ab", "cde"], "n": 2, "temperature": 0, "max_tokens": 3},
    )
    body = resp.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert all(c["text"] == REPLY[:3] for c in body["choices"])
    assert body["usage"]["prompt_tokens"] == 5  # each prompt once, not once per sample
    assert body["usage"]["completion_tokens"] == 12
    resp = await http.post("/v1/completions", json={"prompt": [104, 105], "max_tokens": 2})
    assert resp.json()["usage"]["prompt_tokens"] == 2


async def test_n_and_seed_reproducible(server):
    _, _, http = server
    req = chat(n=2, seed=7, temperature=1.0, max_tokens=12)
    a = (await http.post("/v1/chat/completions", json=req)).json()
    b = (await http.post("/v1/chat/completions", json=req)).json()
    texts_a = [c["message"]["content"] for c in a["choices"]]
    texts_b = [c["message"]["content"] for c in b["choices"]]
    assert texts_a == texts_b
    assert texts_a[0] != texts_a[1]  # choice i uses seed + i
    assert a["usage"]["completion_tokens"] == 24
    assert a["usage"]["prompt_tokens"] == len("user: hi\nassistant: ")


async def test_stop_string(server):
    _, _, http = server
    resp = await http.post("/v1/chat/completions", json=chat(temperature=0, stop="fake"))
    choice = resp.json()["choices"][0]
    assert choice["message"]["content"] == "Hello from the "
    assert choice["finish_reason"] == "stop"


async def test_chat_stream_event_order(server):
    _, _, http = server
    resp = await http.post(
        "/v1/chat/completions",
        json=chat(temperature=0, stream=True, stream_options={"include_usage": True}),
    )
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    first, *middle, final, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"]["content"] for c in middle) == REPLY
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in middle)
    assert final["choices"][0]["delta"] == {}
    assert all(c["choices"][0]["finish_reason"] is None for c in middle)
    assert all("spec_decode" not in c["choices"][0] for c in middle)
    assert all(c["usage"] is None for c in middle)
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["choices"][0]["spec_decode"]["num_steps"] > 0
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(REPLY)


async def test_completion_stream_n2_without_usage(server):
    _, _, http = server
    resp = await http.post(
        "/v1/completions",
        json={"prompt": "p", "n": 2, "temperature": 0, "max_tokens": 6, "stream": True},
    )
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("usage" not in c for c in chunks)
    texts = ["", ""]
    finals = {}
    for c in chunks:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"]:
            finals[choice["index"]] = choice["finish_reason"]
    assert texts == [REPLY[:6]] * 2
    assert finals == {0: "length", 1: "length"}


async def test_chat_logprobs_shape(server):
    _, _, http = server
    resp = await http.post(
        "/v1/chat/completions",
        json=chat(temperature=0, max_tokens=3, logprobs=True, top_logprobs=2),
    )
    content = resp.json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == list(REPLY[:3])
    assert content[0]["bytes"] == list(b"H")
    assert content[0]["logprob"] == -0.25
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["H", "x"]


async def test_completion_logprobs_shape(server):
    _, _, http = server
    resp = await http.post(
        "/v1/completions", json={"prompt": "p", "temperature": 0, "max_tokens": 3, "logprobs": 1}
    )
    lp = resp.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == list(REPLY[:3])
    assert lp["token_logprobs"] == [-0.25] * 3
    assert lp["top_logprobs"][0] == {"H": -0.25}
    assert lp["text_offset"] == [0, 1, 2]


async def test_chat_stream_logprobs(server):
    _, _, http = server
    resp = await http.post(
        "/v1/chat/completions", json=chat(temperature=0, max_tokens=4, logprobs=True, stream=True)
    )
    chunks = [json.loads(d) for d in sse_data(resp.text)[:-1]]
    tokens = [
        t["token"]
        for c in chunks
        if c["choices"][0].get("logprobs")
        for t in c["choices"][0]["logprobs"]["content"]
    ]
    assert "".join(tokens) == REPLY[:4]


async def test_token_sources_only_when_asked_and_their_ends_index_the_text(server):
    _, _, http = server
    plain = (await http.post("/v1/chat/completions", json=chat(temperature=0, max_tokens=5))).json()
    assert "token_sources" not in plain["choices"][0]  # OpenAI clients see nothing new
    body = (await http.post("/v1/chat/completions", json=chat(temperature=0, max_tokens=5, token_sources=True))).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == plain["choices"][0]["message"]["content"] == REPLY[:5]
    # two tokens per fake step: the head's draft, then the target's own
    assert choice["token_sources"] == [
        {"source": s, "text_end": end} for s, end in zip(["head", "target", "head", "target", "target"], [1, 2, 3, 4, 5])
    ]
    completion = (await http.post("/v1/completions", json={"prompt": "p", "temperature": 0, "max_tokens": 3,
                                                             "token_sources": True})).json()
    assert [t["source"] for t in completion["choices"][0]["token_sources"]] == ["head", "target", "target"]
    resp = await http.post("/v1/chat/completions", json=chat(temperature=0, max_tokens=4, token_sources=True, stream=True))
    chunks = [json.loads(d)["choices"][0] for d in sse_data(resp.text)[:-1]]
    sources = [t for c in chunks for t in c.get("token_sources", [])]
    assert [t["text_end"] for t in sources] == [1, 2, 3, 4]
    assert "".join(c["delta"].get("content", "") for c in chunks) == REPLY[:4]
    assert "token_sources" not in chunks[-1]  # the final chunk carries finish_reason and spec_decode
    stream = await http.post("/v1/chat/completions", json=chat(temperature=0, max_tokens=4, stream=True))
    assert "token_sources" not in stream.text
    bad = await http.post("/v1/chat/completions", json=chat(token_sources="yes"))
    assert_error(bad, 400, "token_sources")


async def test_models_tokenize_health_metrics(server):
    _, _, http = server
    models = (await http.get("/v1/models")).json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "fake-model"
    assert models["data"][0]["max_model_len"] == 512
    card = (await http.get("/v1/models/fake-model")).json()
    assert card == models["data"][0]
    assert_error(await http.get("/v1/models/other-model"), 404, param="model", code="model_not_found")
    tok = (await http.post("/tokenize", json={"model": "fake-model", "prompt": "abc"})).json()
    assert tok["tokens"] == [97, 98, 99] and tok["count"] == 3
    tok = (
        await http.post("/tokenize", json={"messages": [{"role": "user", "content": "x"}]})
    ).json()
    assert tok["count"] == len("user: x\nassistant: ")
    assert (await http.get("/health")).status_code == 200
    await http.post("/v1/completions", json={"prompt": "p", "max_tokens": 4})
    text = (await http.get("/metrics")).text
    assert 'eagle_generation_tokens_total{model_name="fake-model"} 4.0' in text
    assert (
        'eagle_request_success_total{finished_reason="length",model_name="fake-model"} 1.0' in text
    )
    assert 'eagle_num_requests_running{model_name="fake-model"} 0.0' in text
    assert "eagle_num_requests_running_peak" in text


async def test_dashboard_series_exist_at_zero_before_any_request(server):
    _, _, http = server
    text = (await http.get("/metrics")).text
    for series in (
        'eagle_inter_chunk_latency_seconds_count{model_name="fake-model"} 0.0',
        'eagle_time_to_first_token_seconds_count{model_name="fake-model"} 0.0',
        'eagle_generation_tokens_total{model_name="fake-model"} 0.0',
        'eagle_request_success_total{finished_reason="stop",model_name="fake-model"} 0.0',
        'eagle_request_failure_total{model_name="fake-model",reason="internal_error"} 0.0',
        'eagle_request_failure_total{model_name="fake-model",reason="queue_full"} 0.0',
    ):
        assert series in text, series


async def test_curl_style_body_without_content_type(server):
    _, _, http = server
    resp = await http.post(
        "/v1/completions",
        content=b'{"prompt": "p", "max_tokens": 2}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"]


async def test_health_is_503_while_loading():
    gate = threading.Event()
    engine = FakeEngine()

    def slow_factory():
        gate.wait(10)
        return engine

    _, client, http = await make_server(factory=slow_factory)
    try:
        resp = await http.get("/health")
        assert resp.status_code == 503 and resp.json()["status"] == "loading"
        resp = await http.post("/v1/chat/completions", json=chat())
        assert_error(resp, 503, code="model_loading")
        assert resp.headers["retry-after"] == "1"
        for path in ("/v1/models", "/v1/models/fake-model"):
            assert_error(await http.get(path), 503, code="model_loading")
        gate.set()
        await client.wait_ready()
        assert (await http.get("/health")).status_code == 200
    finally:
        gate.set()
        await http.aclose()
        client.shutdown()


async def test_health_reports_load_failure():
    def broken():
        raise RuntimeError("no such model")

    _, client, http = await make_server(factory=broken)
    with pytest.raises(Exception, match="failed to load"):
        await client.wait_ready()
    resp = await http.get("/health")
    assert resp.status_code == 503 and resp.json()["status"] == "failed"
    await http.aclose()


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(temperature=5), "temperature"),
        (chat(top_p=0), "top_p"),
        (chat(n=0), "n"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(top_logprobs=3), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=50), "top_logprobs"),
        (chat(max_completion_tokens=0), "max_completion_tokens"),
        (chat(min_tokens=5, max_tokens=2), "min_tokens"),
        (chat(min_tokens=-1), "min_tokens"),
        (chat(response_format={"type": "yaml"}), "response_format"),
        (chat(response_format={"type": "json_schema"}), "response_format"),
        (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}), "response_format"),
        (chat(tools=[{"type": "function", "function": {}}]), "tools.0"),
        (chat(tools=[{"type": "retrieval"}]), "tools.0"),
        (chat(tool_choice="required"), "tool_choice"),
        (chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice"),
        (chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required",
              response_format={"type": "json_object"}), "response_format"),
        (chat(functions=[{"name": "f"}]), "functions"),
        (chat(logit_bias={"five": 10}), "logit_bias"),
        (chat(logit_bias={"-5": 10}), "logit_bias"),
        (chat(logit_bias={"\u00b2": 10}), "logit_bias"),  # a digit to str.isdigit, not to int()
        (chat(logit_bias={"5": 150}), "logit_bias"),
        (chat(n=17), "n"),  # more choices than --max-waiting (16 here): never servable
        (chat(stop=["a"] * 17), "stop"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        (chat(temperature="hot"), "temperature"),
        (chat(cache_salt=""), "cache_salt"),
        (chat(cache_salt=7), "cache_salt"),
        ({"model": "fake-model"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        (chat(messages=[{"role": "user", "content": "x" * 600}]), "messages"),
        # strict types: no coercion from strings or between booleans and integers
        (chat(max_tokens="3"), "max_tokens"),
        (chat(n=True), "n"),
        (chat(temperature="0.5"), "temperature"),
        (chat(stream="true"), "stream"),
        (chat(logprobs=1), "logprobs"),
        # content is required on user and system turns
        ({"messages": [{"role": "user"}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": []}]}, "messages.0"),
        ({"messages": [{"role": "system", "content": None}, {"role": "user", "content": "x"}]}, "messages.0"),
    ],
)
async def test_chat_400_names_the_parameter(server, body, param):
    _, _, http = server
    resp = await http.post("/v1/chat/completions", json=body)
    err = assert_error(resp, 400, param=param)
    assert err["type"] == "invalid_request_error"
    # The server keeps serving after the error.
    assert (await http.post("/v1/chat/completions", json=chat(max_tokens=2))).status_code == 200


async def test_integer_numbers_and_content_free_assistant_turns_are_accepted(server):
    _, _, http = server
    body = chat(
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None},
            {"role": "user", "content": "Again"},
        ],
        temperature=1,
        top_p=1,
        max_tokens=2,
    )
    assert (await http.post("/v1/chat/completions", json=body)).status_code == 200


@pytest.mark.parametrize(
    ("part", "says"),
    [
        ({"type": "image_url", "image_url": {"url": "http://x/y.png"}}, "not 'image_url'"),
        ({"type": "text"}, "needs a string 'text'"),
        ("hello", "not 'str'"),
    ],
)
async def test_content_parts_other_than_text_are_named(server, part, says):
    _, _, http = server
    body = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}])
    err = assert_error(await http.post("/v1/chat/completions", json=body), 400, param="messages.0.content")
    assert says in err["message"]
    ok = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}], max_tokens=2)
    assert (await http.post("/v1/chat/completions", json=ok)).status_code == 200


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
async def test_non_finite_json_numbers_are_400s(server, value):
    """Python's json module (FastAPI's parser) reads NaN and Infinity; a range check written
    as `x <= 0` lets NaN through."""
    _, _, http = server
    body = '{"messages": [{"role": "user", "content": "Hi"}], "repetition_penalty": ' + value + "}"
    resp = await http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert_error(resp, 400, param="repetition_penalty")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "fake-model"}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": []}, "prompt"),
        ({"prompt": "x", "frequency_penalty": 3}, "frequency_penalty"),
        ({"prompt": "x", "repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
async def test_completion_400_names_the_parameter(server, body, param):
    _, _, http = server
    assert_error(await http.post("/v1/completions", json=body), 400, param=param)


async def test_400_for_malformed_json(server):
    _, _, http = server
    resp = await http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(resp, 400)


@pytest.mark.parametrize("body", [b"[1, 2]", b'"hi"', b"null", b"3"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
async def test_400_for_a_body_that_is_not_an_object(server, path, body):
    """Found while fuzzing the routes: the message read "Invalid value for 'None'"."""
    _, _, http = server
    err = assert_error(await http.post(path, content=body), 400)
    assert err["message"] == "Invalid request body: Input should be an object"


async def test_401_when_api_key_is_set():
    _, client, http = await make_server(api_key="sekret")
    await client.wait_ready()
    try:
        assert_error(
            await http.post("/v1/chat/completions", json=chat()), 401, code="invalid_api_key"
        )
        resp = await http.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        err = assert_error(resp, 401)
        assert err["type"] == "authentication_error"
        assert_error(await http.post("/tokenize", json={"prompt": "x"}), 401)
        ok = await http.post(
            "/v1/chat/completions",
            json=chat(max_tokens=2),
            headers={"Authorization": "Bearer sekret"},
        )
        assert ok.status_code == 200
        assert (await http.get("/health")).status_code == 200  # probes need no key
        metrics = (await http.get("/metrics")).text
        assert (
            'eagle_request_failure_total{model_name="fake-model",reason="invalid_api_key"} 3.0'
            in metrics
        )
    finally:
        await http.aclose()
        client.shutdown()


async def test_404_unknown_model_and_route(server):
    _, _, http = server
    err = assert_error(
        await http.post("/v1/chat/completions", json=chat(model="gpt-9")),
        404,
        "model",
        "model_not_found",
    )
    assert "gpt-9" in err["message"]
    assert_error(
        await http.post("/v1/completions", json={"model": "x", "prompt": "p"}), 404, "model"
    )
    assert_error(await http.get("/v1/nothing"), 404)
    # The engine's own name is accepted as an alias of the served name.
    resp = await http.post("/v1/completions", json={"model": "fake-model", "prompt": "p"})
    assert resp.status_code == 200


async def test_413_body_too_large():
    _, client, http = await make_server(max_request_bytes=1000)
    await client.wait_ready()
    try:
        big = chat(messages=[{"role": "user", "content": "x" * 2000}])
        err = assert_error(await http.post("/v1/chat/completions", json=big), 413)
        assert err["code"] == "request_too_large"

        async def chunked():  # no Content-Length: the limit is enforced while reading
            for _ in range(20):
                yield b" " * 100

        resp = await http.post("/v1/completions", content=chunked())
        assert_error(resp, 413)
        assert (await http.post("/v1/completions", json={"prompt": "ok"})).status_code == 200
    finally:
        await http.aclose()
        client.shutdown()


async def test_429_when_queue_is_full_then_recovers():
    engine = FakeEngine()
    engine.paused = True
    _, client, http = await make_server(engine=engine, max_waiting=2)
    await client.wait_ready()
    try:
        held = [
            asyncio.create_task(http.post("/v1/completions", json={"prompt": "p", "max_tokens": 2}))
            for _ in range(2)
        ]
        for _ in range(200):
            if client.num_waiting == 2:
                break
            await asyncio.sleep(0.01)
        resp = await http.post("/v1/chat/completions", json=chat(stream=True))
        err = assert_error(resp, 429, code="queue_full")
        assert err["type"] == "rate_limit_error"
        assert int(resp.headers["retry-after"]) >= 1
        engine.paused = False
        done = await asyncio.gather(*held)
        assert all(r.status_code == 200 for r in done)
        assert (await http.post("/v1/chat/completions", json=chat(n=2))).status_code == 200
    finally:
        engine.paused = False
        await http.aclose()
        client.shutdown()


async def test_500_hides_internals_and_server_recovers(server):
    engine, _, http = server
    engine.fail_next_step = "CUDA exploded at /secret/path/model.py line 42"
    resp = await http.post("/v1/chat/completions", json=chat(max_tokens=4))
    err = assert_error(resp, 500, code="internal_error")
    assert err["type"] == "server_error"
    assert "secret" not in resp.text and "CUDA" not in resp.text
    ok = await http.post("/v1/chat/completions", json=chat(max_tokens=4, temperature=0))
    assert ok.json()["choices"][0]["message"]["content"] == REPLY[:4]


async def test_500_inside_a_stream_is_an_error_event(server):
    engine, _, http = server
    engine.step_delay = 0.01
    engine.fail_next_step = None

    async def fail_soon():
        await asyncio.sleep(0.05)
        engine.fail_next_step = "secret detail"

    task = asyncio.create_task(fail_soon())
    resp = await http.post("/v1/chat/completions", json=chat(stream=True, max_tokens=None))
    await task
    assert resp.status_code == 200
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "internal_error"
    assert "secret" not in resp.text


async def test_cors_preflight_and_headers():
    _, client, http = await make_server(allowed_origins=("http://ui.example",), api_key="k")
    await client.wait_ready()
    try:
        pre = await http.options(
            "/v1/chat/completions",
            headers={
                "Origin": "http://ui.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type",
            },
        )
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "http://ui.example"
        resp = await http.post(
            "/v1/chat/completions", json=chat(), headers={"Origin": "http://ui.example"}
        )
        assert resp.status_code == 401
        assert resp.headers["access-control-allow-origin"] == "http://ui.example"
        # A bug's 500 reaches the browser as the error, not as a CORS failure.
        client.engine.apply_chat_template = lambda messages: 1 / 0
        resp = await http.post(
            "/v1/chat/completions", json=chat(),
            headers={"Origin": "http://ui.example", "Authorization": "Bearer k"},
        )  # fmt: skip
        assert_error(resp, 500, code="internal_error")
        assert resp.headers["access-control-allow-origin"] == "http://ui.example"
    finally:
        await http.aclose()
        client.shutdown()


async def test_a_request_queued_as_the_engine_loop_dies_is_answered():
    """An add the dying loop never applied must not leave its HTTP request waiting forever."""
    engine = FakeEngine()
    _, client, http = await make_server(engine=engine)
    await client.wait_ready()
    inside, release = threading.Event(), threading.Event()

    def broken() -> bool:
        if not engine.waiting:
            return False  # idle: the loop waits for a command
        inside.set()  # the first request was added
        release.wait(5)
        raise RuntimeError("loop bug")

    try:
        engine.has_unfinished = broken
        first = asyncio.create_task(http.post("/v1/chat/completions", json=chat(max_tokens=2)))
        assert await asyncio.to_thread(inside.wait, 5)  # the loop took the first add, then hung
        second = asyncio.create_task(http.post("/v1/chat/completions", json=chat(max_tokens=2)))
        while client._commands.empty():  # the second add is queued behind the stuck loop
            await asyncio.sleep(0.01)
        release.set()
        assert_error(await asyncio.wait_for(first, 5), 500, code="internal_error")
        assert_error(await asyncio.wait_for(second, 5), 503, code="engine_failed")
    finally:
        release.set()
        await http.aclose()
        client.shutdown()


async def test_after_shutdown_requests_are_told_the_server_is_stopping():
    _, client, http = await make_server(engine=FakeEngine())
    await client.wait_ready()
    client.shutdown()
    try:
        resp = await http.post("/v1/chat/completions", json=chat(max_tokens=2))
        assert_error(resp, 503, code="server_shutdown")
        assert resp.headers["retry-after"] == "1"  # another replica can take it
        health = await http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "stopped"
        assert 'reason="server_shutdown"' not in (await http.get("/metrics")).text  # not a failure
    finally:
        await http.aclose()


async def test_dead_engine_loop_fails_requests_and_health():
    engine = FakeEngine()
    engine.step_delay = 0.01
    _, client, http = await make_server(engine=engine)
    await client.wait_ready()
    try:

        def broken() -> bool:
            raise RuntimeError("loop bug")

        task = asyncio.create_task(http.post("/v1/chat/completions", json=chat(max_tokens=None)))
        await asyncio.sleep(0.05)
        engine.has_unfinished = broken
        resp = await task
        assert_error(resp, 500, code="internal_error")
        assert "loop bug" not in resp.text
        health = await http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        # Later requests are told the engine is gone (not "still loading"), and count as the
        # server's failures.
        resp = await http.post("/v1/chat/completions", json=chat(max_tokens=2))
        assert_error(resp, 503, code="engine_failed")
        assert "retry-after" not in resp.headers
        metrics = (await http.get("/metrics")).text
        assert 'eagle_request_failure_total{model_name="fake-model",reason="engine_failed"} 1.0' in metrics
    finally:
        await http.aclose()
        client.shutdown()


def test_text_parts_built_in_code_are_accepted():
    message = ChatMessage(role="user", content=[TextPart(type="text", text="Hi"), {"type": "text", "text": "!"}])
    assert message.text() == "Hi!"


def test_logit_bias_reaches_the_sampling_params_with_integer_token_ids():
    request = ChatCompletionRequest.model_validate(chat(logit_bias={"7": -2.5, "5": 10}))
    assert request.sampling_params().logit_bias == ((5, 10), (7, -2.5))


async def test_debug_speculation_shows_the_policy_state(server):
    from eagle_core.spec.policy import Candidate, SpeculationPolicy, StepCosts

    _, client, http = server
    assert (await http.get("/debug/speculation")).json() == {"policy": None}
    policy = SpeculationPolicy(StepCosts({1: 0.020, 4: 0.024}, {1: 0.010, 4: 0.040}), max_tree_nodes=2)
    policy.choose([Candidate("a", True, head=True)])
    client.engine_stats = {"spec_policy": policy.as_dict()}
    state = (await http.get("/debug/speculation")).json()["policy"]
    assert state["drafting"] == 1 and state["tree_nodes"] == 2
    assert state["costs"]["draft"] == {"1": 0.010, "4": 0.040} and state["costs"]["feed"] == 0
    assert state["expected_tokens_per_second"] == pytest.approx(2 / (policy.costs.plain(2) + 0.010))


async def test_debug_routes_need_the_api_key():
    _, client, http = await make_server(api_key="secret")
    await client.wait_ready()
    assert_error(await http.get("/debug/speculation"), 401, code="invalid_api_key")
    ok = await http.get("/debug/speculation", headers={"Authorization": "Bearer secret"})
    assert ok.status_code == 200
    await http.aclose()
    client.shutdown()


async def test_the_playground_is_served_at_the_root_with_local_assets_only_and_without_the_key():
    import re

    _, client, http = await make_server(api_key="secret")
    await client.wait_ready()
    try:
        page = await http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        links = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert links and all(link.startswith("/") and not link.startswith("//") for link in links), links
        for asset in ("/playground/playground.js", "/playground/playground.css"):
            resp = await http.get(asset)
            assert resp.status_code == 200 and resp.text, asset
            assert "http://" not in resp.text and "https://" not in resp.text  # nothing from elsewhere
        assert (await http.get("/playground/missing.js")).status_code == 404
        assert (await http.get("/v1/models")).status_code == 401  # the API itself still needs the key
    finally:
        await http.aclose()
        client.shutdown()
