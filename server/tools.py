"""Tool calls (OpenAI's `tools` and `tool_choice` on chat completions).

- Prompt: a chat template that renders tools (its source mentions `tools`, as Qwen2's and
  Qwen3's do) gets them as the `tools` argument and the conversation's tool calls and results
  in its own format. Any other template gets `tools_system_text` added to the system message
  (a new one when there is none), earlier calls written into the assistant's content as
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and tool results as user messages.
- `tool_choice`: "none" (the model answers in text; tools stay in the prompt as OpenAI does),
  "auto" (the model chooses; `<tool_call>` blocks in its answer become tool calls), "required"
  (the answer is a JSON array of `{"name": ..., "arguments": {...}}` calls, enforced by a
  grammar; one call when `parallel_tool_calls` is false) or a named function (the answer is that function's arguments, enforced by a
  grammar over its parameters' schema).
- Response: `message.tool_calls` (ids `call_...`, `function.arguments` a JSON string),
  `finish_reason` "tool_calls". What cannot be parsed as calls stays text.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from eagle_core.errors import InvalidRequestError
from eagle_core.sampling_params import Grammar

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolMode:
    kind: Literal["none", "auto", "required", "named"]
    name: str | None = None
    """The function a named tool_choice asks for."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text of the arguments, as OpenAI sends them."""


def parse_tools(tools: list[Any] | None) -> list[Tool]:
    """OpenAI's `tools` list, checked: function tools with distinct names and object parameters."""
    out: list[Tool] = []
    for i, item in enumerate(tools or []):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(item, dict) or item.get("type") != "function" or not isinstance(function, dict):
            raise InvalidRequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", f"tools.{i}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"tools[{i}].function needs a non-empty 'name'", f"tools.{i}")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InvalidRequestError(f"tools[{i}].function.parameters must be a JSON schema object", f"tools.{i}")
        if any(t.name == name for t in out):
            raise InvalidRequestError(f"two tools are named {name!r}", f"tools.{i}")
        out.append(Tool(name, str(function.get("description") or ""), parameters))
    return out


def tool_mode(tool_choice: Any, tools: list[Tool]) -> ToolMode:
    """OpenAI's `tool_choice` (default: "auto" with tools, "none" without)."""
    if tool_choice is None:
        return ToolMode("auto" if tools else "none")
    if tool_choice in ("none", "auto", "required"):
        if tool_choice != "none" and not tools:
            raise InvalidRequestError(f"tool_choice {tool_choice!r} needs tools", "tool_choice")
        return ToolMode(tool_choice)
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
    if not isinstance(name, str):
        raise InvalidRequestError(
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if not any(t.name == name for t in tools):
        raise InvalidRequestError(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    return ToolMode("named", name)


def call_grammar(mode: ToolMode, tools: list[Tool], parallel: bool = True) -> Grammar | None:
    """The grammar that enforces `required` and named choices (one call at most unless
    `parallel`, OpenAI's parallel_tool_calls); None for "none" and "auto"."""
    if mode.kind == "named":
        tool = next(t for t in tools if t.name == mode.name)
        return Grammar("json_schema", json.dumps(tool.parameters), param="tool_choice")
    if mode.kind != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return Grammar("json_schema", json.dumps(schema), param="tool_choice")


def tools_system_text(tools: list[Tool]) -> str:
    """The tools' description for templates that do not render tools (added to the system message)."""
    listed = "\n".join(json.dumps(t.as_openai()["function"]) for t in tools)
    return (
        "You can call the following functions:\n"
        f"{listed}\n"
        "To call a function, answer with "
        f'{CALL_OPEN}{{"name": <function name>, "arguments": <arguments as a JSON object>}}{CALL_CLOSE}'
        " (one block per call) and nothing else."
    )


def template_has_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a `tools` argument."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def render_messages(messages: list[dict], tools: list[Tool], native: bool) -> list[dict]:
    """Template messages for a conversation with tools (see the module docstring); `messages`
    are ChatMessage.to_template() dicts, which carry `tool_calls` / `tool_call_id` if given."""
    out: list[dict] = []
    for m in messages:
        if native:
            out.append(m)
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"Result of the function call {m.get('tool_call_id') or ''}: {m['content']}"})
        elif m.get("tool_calls"):
            blocks = "".join(
                f"{CALL_OPEN}{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}{CALL_CLOSE}"
                for c in m["tool_calls"]
            )
            out.append({"role": "assistant", "content": (m.get("content") or "") + blocks})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools and not native:
        text = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse_output(mode: ToolMode, text: str, tools: list[Tool]) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of a finished answer; text that is not a valid call stays content."""
    names = {t.name for t in tools}
    if mode.kind == "named":
        try:
            json.loads(text)
        except ValueError:
            return text, []
        return None, [ToolCall(new_call_id(), mode.name, text)]
    if mode.kind == "required":
        try:
            items = json.loads(text)
        except ValueError:
            return text, []
        calls = [_call(item, names) for item in items] if isinstance(items, list) else [None]
        if not calls or None in calls:
            return text, []
        return None, calls
    if mode.kind != "auto" or CALL_OPEN not in text:
        return text, []
    content, calls = [], []
    rest = text
    while CALL_OPEN in rest:
        before, after = rest.split(CALL_OPEN, 1)
        body, closed, rest = after.partition(CALL_CLOSE)
        call = _call(_loads(body), names) if closed else None
        if call is None:
            content.append(before + CALL_OPEN + body + closed)
            continue
        content.append(before)
        calls.append(call)
    content.append(rest)
    joined = "".join(content)
    return (joined if joined.strip() else None), calls


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(item: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(item, dict) or item.get("name") not in names:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(), item["name"], json.dumps(arguments))


def held_back(text: str) -> int:
    """How many characters at the end of streamed `auto` text to hold back: from the first
    `<tool_call>` on, or a tail that could still become one."""
    start = text.find(CALL_OPEN)
    if start >= 0:
        return len(text) - start
    for keep in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-keep:]):
            return keep
    return 0


class ToolStream:
    """What one streamed choice sends as content while tool calls may still come: in "auto"
    mode the text before any `<tool_call>` (nothing while it is only whitespace), in the other
    modes nothing until the end. `finish` gives the rest, so content streamed plus the rest is
    the content of the same answer unstreamed."""

    def __init__(self, mode: ToolMode, tools: list[Tool]):
        self.mode = mode
        self.tools = tools
        self.sent = 0

    def content(self, text: str) -> str:
        """New content to send, given the choice's whole text so far."""
        if self.mode.kind != "auto":
            return ""
        upto = len(text) - held_back(text)
        if upto <= self.sent or not text[:upto].strip():
            return ""
        new, self.sent = text[self.sent : upto], upto
        return new

    def finish(self, text: str, finish_reason: str | None) -> tuple[str | None, list[ToolCall], str | None]:
        """(content not sent yet, tool calls, finish reason) of the finished choice."""
        content, calls = answer(self.mode, text, self.tools, finish_reason)[:2]
        rest = (content or "")[self.sent :] if calls else text[self.sent :]
        return rest or None, calls, "tool_calls" if calls else finish_reason


def answer(mode: ToolMode, text: str, tools: list[Tool], finish_reason: str | None) -> tuple[str | None, list[ToolCall], str | None]:
    """(content, tool calls, finish reason) of a finished answer: calls only from an answer the
    model ended itself; then the finish reason is "tool_calls"."""
    if mode.kind == "none" or finish_reason != "stop":
        return text, [], finish_reason
    content, calls = parse_output(mode, text, tools)
    return (content, calls, "tool_calls") if calls else (text, [], finish_reason)
