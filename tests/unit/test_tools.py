"""Tool calls (server/tools.py): modes, grammars, prompts, and answers parsed alike streamed or not."""

from __future__ import annotations

import json

import pytest

from eagle_core.errors import InvalidRequestError
from eagle_core.grammar import GrammarCompiler
from server.tools import (
    CALL_CLOSE,
    CALL_OPEN,
    ToolMode,
    ToolStream,
    answer,
    call_grammar,
    held_back,
    parse_tools,
    render_messages,
    tool_mode,
)
from tests.models import make_tiny_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = parse_tools([WEATHER, TIME])


def test_tool_choice_modes_and_their_errors():
    assert tool_mode(None, TOOLS) == ToolMode("auto") and tool_mode(None, []) == ToolMode("none")
    assert tool_mode("required", TOOLS) == ToolMode("required")
    assert tool_mode({"type": "function", "function": {"name": "get_time"}}, TOOLS) == ToolMode("named", "get_time")
    for bad in ("required", {"type": "function", "function": {"name": "nope"}}, "sometimes", {"function": {"name": "get_time"}}):
        with pytest.raises(InvalidRequestError) as err:
            tool_mode(bad, TOOLS if bad != "required" else [])
        assert err.value.param == "tool_choice"
    with pytest.raises(InvalidRequestError):
        parse_tools([WEATHER, WEATHER])


def test_grammars_of_required_and_named_choices_compile_and_describe_the_calls():
    compiler = GrammarCompiler(make_tiny_tokenizer(), 512)
    required = call_grammar(ToolMode("required"), TOOLS)
    schema = json.loads(required.source)
    assert schema["minItems"] == 1 and [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]] == ["get_weather", "get_time"]
    named = call_grammar(ToolMode("named", "get_weather"), TOOLS)
    assert json.loads(named.source) == WEATHER["function"]["parameters"]
    for grammar in (required, named):
        compiler.check(grammar)
        assert grammar.param == "tool_choice"
    assert call_grammar(ToolMode("auto"), TOOLS) is None
    assert "maxItems" not in schema and json.loads(call_grammar(ToolMode("required"), TOOLS, parallel=False).source)["maxItems"] == 1


def test_answers_become_tool_calls_only_when_they_parse_and_the_model_ended_them():
    content, calls, reason = answer(ToolMode("named", "get_weather"), '{"city": "Paris"}', TOOLS, "stop")
    assert content is None and reason == "tool_calls"
    assert (calls[0].name, json.loads(calls[0].arguments)) == ("get_weather", {"city": "Paris"})
    assert calls[0].id.startswith("call_")
    text = '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    assert [c.name for c in answer(ToolMode("required"), text, TOOLS, "stop")[1]] == ["get_time", "get_weather"]
    assert answer(ToolMode("required"), text[:20], TOOLS, "length") == (text[:20], [], "length")
    auto = f'Let me check.{CALL_OPEN}{{"name": "get_weather", "arguments": {{"city": "Rome"}}}}{CALL_CLOSE}'
    content, calls, reason = answer(ToolMode("auto"), auto, TOOLS, "stop")
    assert content == "Let me check." and calls[0].arguments == '{"city": "Rome"}' and reason == "tool_calls"
    unknown = f'{CALL_OPEN}{{"name": "rm_rf", "arguments": {{}}}}{CALL_CLOSE}'
    assert answer(ToolMode("auto"), unknown, TOOLS, "stop") == (unknown, [], "stop")
    assert answer(ToolMode("auto"), "Just text.", TOOLS, "stop") == ("Just text.", [], "stop")


@pytest.mark.parametrize("text", [
    f'Sure. {CALL_OPEN}{{"name": "get_time", "arguments": {{}}}}{CALL_CLOSE} Done.',
    f'\n{CALL_OPEN}{{"name": "get_time", "arguments": {{}}}}{CALL_CLOSE}',
    "Plain <tool answer> with <tool_ and no call",
    f'{CALL_OPEN}{{"name": "get_time", "arg',
])
def test_streamed_content_plus_the_rest_is_the_unstreamed_content(text):
    stream = ToolStream(ToolMode("auto"), TOOLS)
    sent = "".join(stream.content(text[:end]) for end in range(1, len(text) + 1))
    rest, calls, reason = stream.finish(text, "stop")
    content, expected_calls, expected_reason = answer(ToolMode("auto"), text, TOOLS, "stop")
    assert (sent + (rest or "")) == (content or "") and reason == expected_reason
    assert [c.name for c in calls] == [c.name for c in expected_calls]
    assert CALL_OPEN not in sent


def test_held_back_covers_a_call_and_any_tail_that_could_start_one():
    assert held_back("abc") == 0 and held_back("abc<") == 1 and held_back("abc<tool_c") == 7
    assert held_back("a<tool_call>xyz") == len("<tool_call>xyz")


def test_templates_without_tools_get_them_in_the_system_message_and_calls_as_text():
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "18C, sunny", "tool_call_id": "call_1"},
    ]
    out = render_messages(messages, TOOLS, native=False)
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"] and CALL_OPEN in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": f'{CALL_OPEN}{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}{CALL_CLOSE}'}
    assert out[3]["role"] == "user" and "call_1" in out[3]["content"] and "18C, sunny" in out[3]["content"]
    system_first = render_messages([{"role": "system", "content": "Be brief."}, messages[0]], TOOLS, native=False)
    assert system_first[0]["content"].startswith("Be brief.\n\n") and len(system_first) == 2
    assert render_messages(messages, TOOLS, native=True) == messages


def test_templates_that_render_tools_get_them_and_the_calls_in_their_own_format():
    from eagle_core.chat import chat_prompt_ids
    from server.tools import template_has_tools

    tokenizer = make_tiny_tokenizer()
    assert not template_has_tools(tokenizer)
    tokenizer.chat_template = (
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}{{ c.function.arguments | tojson }}</call>{% endfor %}"
        "{% endfor %}[assistant]"
    )
    assert template_has_tools(tokenizer)
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    ids = chat_prompt_ids(tokenizer, render_messages(messages, TOOLS, native=True), tools=[t.as_openai() for t in TOOLS])
    assert tokenizer.decode(ids) == (
        '<tools>get_weather;get_time;</tools>[user]Weather?[assistant]<call>get_weather{"city": "Paris"}</call>'
        "[tool]sunny[assistant]"
    )
