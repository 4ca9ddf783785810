"""The official `openai` SDK against the real server running the default SmolLM2 model."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.e2e.server_process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def sdk(smollm2_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def async_sdk(smollm2_server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)


def test_server_answered_503_while_loading(smollm2_server):
    assert smollm2_server.saw_loading


def test_models(sdk):
    models = sdk.models.list()
    assert [m.id for m in models.data] == ["smollm2"]


def test_chat(sdk):
    resp = sdk.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=12, temperature=0
    )
    choice = resp.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 12
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    spec = choice.model_extra["spec_decode"]
    assert spec["num_steps"] >= 1 and spec["num_accepted_tokens"] <= spec["num_draft_tokens"]


def test_chat_stream_with_usage(sdk):
    reference = sdk.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=12, temperature=0
    )
    chunks = list(
        sdk.chat.completions.create(
            model="smollm2",
            messages=MESSAGES,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert finals[0].choices[0].model_extra["spec_decode"]["num_steps"] >= 1
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == reference.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == reference.usage.prompt_tokens


def test_completions_default_max_tokens_and_stream(sdk):
    resp = sdk.completions.create(model="smollm2", prompt="Once upon a time", temperature=0)
    assert resp.usage.completion_tokens == 16  # OpenAI's default max_tokens for completions
    assert resp.choices[0].finish_reason == "length"
    stream = sdk.completions.create(
        model="smollm2", prompt="Once upon a time", temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == resp.choices[0].text


def test_max_tokens_and_stop(sdk):
    resp = sdk.completions.create(
        model="smollm2", prompt="1, 2, 3, 4, 5,", max_tokens=20, temperature=0
    )
    text = resp.choices[0].text
    assert " 8" in text, text  # the model counts on
    stopped = sdk.completions.create(
        model="smollm2", prompt="1, 2, 3, 4, 5,", max_tokens=20, temperature=0, stop=[" 8"]
    )
    assert stopped.choices[0].text == text[: text.index(" 8")]
    assert stopped.choices[0].finish_reason == "stop"
    short = sdk.completions.create(
        model="smollm2", prompt="1, 2, 3, 4, 5,", max_tokens=3, temperature=0
    )
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"


def test_n2_and_seed_reproducibility(sdk):
    # The speculation policy may serve the two requests through different paths (plain or
    # drafting steps), whose fp32 logits differ in the last bits, so the seeds reproduce up to
    # near-ties (docs/api.md, "Seeds and batches"). top_p keeps the draws off the vocabulary's
    # far tail, where a draw's uniform can land within 1e-7 of a token's edge (seed 1235 at T=1
    # without top_p did, at the 16th token).
    kwargs = dict(
        model="smollm2", messages=MESSAGES, max_tokens=16, temperature=1.0, top_p=0.9, seed=1234, n=2
    )
    first = sdk.chat.completions.create(**kwargs)
    second = sdk.chat.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1]
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in second.choices]
    assert texts[0] != texts[1]  # choice i samples with seed + i
    other = sdk.chat.completions.create(**{**kwargs, "seed": 99, "n": 1})
    assert other.choices[0].message.content not in texts


def test_logprobs(sdk):
    resp = sdk.chat.completions.create(
        model="smollm2",
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert "".join(t.token for t in content) == resp.choices[0].message.content
    for token in content:
        assert len(token.top_logprobs) == 3
        assert token.logprob == pytest.approx(max(t.logprob for t in token.top_logprobs))
    comp = sdk.completions.create(
        model="smollm2", prompt="Hello", max_tokens=3, temperature=0, logprobs=2
    )
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.top_logprobs[0]) == 2


async def test_async_chat_and_completion_streams(async_sdk):
    async def chat_text() -> str:
        stream = await async_sdk.chat.completions.create(
            model="smollm2", messages=MESSAGES, max_tokens=10, temperature=0, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def completion_text() -> str:
        resp = await async_sdk.completions.create(
            model="smollm2", prompt="The sky is", max_tokens=6, temperature=0
        )
        return resp.choices[0].text

    a, b, c = await asyncio.gather(chat_text(), chat_text(), completion_text())
    assert a == b and "Paris" in a
    assert c
    plain = await async_sdk.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=10, temperature=0
    )
    assert plain.choices[0].message.content == a
    await async_sdk.close()


def test_sdk_raises_typed_errors(sdk):
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="smollm2", messages=MESSAGES, temperature=3)
    assert info.value.body["param"] == "temperature"


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"type": "string", "enum": ["en", "fr", "de"]}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}


def test_json_schema_answers_parse_and_validate_streamed_or_not(sdk):
    """response_format json_schema through the SDK: the answer is a document of the schema, at
    T=0 and seeded T=1, and a stream's deltas add up to the same text."""
    import json

    import jsonschema

    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    messages = [{"role": "user", "content": "Invent a person who speaks French. Answer in JSON."}]
    for temperature in (0.0, 1.0):
        kwargs = dict(model="smollm2", messages=messages, max_tokens=200, temperature=temperature, seed=11, response_format=fmt)
        resp = sdk.chat.completions.create(**kwargs)
        text = resp.choices[0].message.content
        assert resp.choices[0].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
        streamed = "".join(c.choices[0].delta.content or "" for c in sdk.chat.completions.create(**kwargs, stream=True) if c.choices)
        assert streamed == text
    obj = sdk.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=200, temperature=0, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    # n > 1 with logprobs: every choice is a document, its logprobs one per token
    many = sdk.chat.completions.create(model="smollm2", messages=messages, max_tokens=200, temperature=1.0, seed=3, n=2,
                                       logprobs=True, response_format=fmt)
    for choice in many.choices:
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert sum(len(c.logprobs.content) for c in many.choices) == many.usage.completion_tokens


def test_a_schema_the_grammar_engine_refuses_is_a_400_with_its_reason(sdk):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "required": 5}}}
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5, response_format=fmt)
    assert err.value.body["param"] == "response_format"
    assert "json_schema" in err.value.body["message"]


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def _calls_of_stream(chunks) -> tuple[list[dict], str | None]:
    """Tool calls accumulated from a stream's deltas by index, as the SDK's helpers do."""
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return [calls[k] for k in sorted(calls)], finish


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_tool_choices_always_return_valid_calls(sdk, tool_choice):
    """One call each (parallel_tool_calls false: with parallel calls allowed this 135M model
    repeats its call until max_tokens at T=0)."""
    import json

    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)}
    for temperature in (0.0, 1.0):
        kwargs = dict(model="smollm2", messages=ASK, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=tool_choice,
                      max_tokens=120, temperature=temperature, seed=5, parallel_tool_calls=False)
        resp = sdk.chat.completions.create(**kwargs)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert call.id.startswith("call_") and call.type == "function"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        if isinstance(tool_choice, dict):
            assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
        streamed, finish = _calls_of_stream(sdk.chat.completions.create(**kwargs, stream=True))
        assert finish == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in streamed] == [
            (c.function.name, c.function.arguments) for c in choice.message.tool_calls]


def test_auto_answers_text_or_calls_and_a_tool_conversation_completes(sdk):
    auto = sdk.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER_TOOL], max_tokens=120, temperature=0)
    message = auto.choices[0].message
    assert (message.tool_calls and auto.choices[0].finish_reason == "tool_calls") or (
        message.content and auto.choices[0].finish_reason in ("stop", "length"))
    first = sdk.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER_TOOL], tool_choice="required",
                                        parallel_tool_calls=False, max_tokens=120, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    follow_up = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    for stream in (False, True):
        kwargs = dict(model="smollm2", messages=follow_up, tools=[WEATHER_TOOL], tool_choice="none",
                      max_tokens=60, temperature=0)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in sdk.chat.completions.create(**kwargs, stream=True) if c.choices)
        else:
            reply = sdk.chat.completions.create(**kwargs)
            text = reply.choices[0].message.content
            assert reply.choices[0].finish_reason in ("stop", "length") and not reply.choices[0].message.tool_calls
        assert text.strip()
