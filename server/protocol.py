"""Pydantic models of the OpenAI request and response bodies this server speaks.

Requests ignore unknown fields, so newer clients keep working, except for the OpenAI features
that change what a client expects back and this server does not implement (legacy `functions`,
tools on completions): those are a 400 rather than free text the client cannot parse. An explicit null means the field's default
where null is not itself a value of the field. Pydantic checks only shapes and types here;
value ranges (temperature in [0, 2], ...) are checked once, by eagle_core.SamplingParams, whose
errors name the parameter.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.fields import FieldInfo

from eagle_core.errors import InvalidRequestError
from eagle_core.sampling_params import Grammar, SamplingParams
from server.tools import Tool, ToolMode, call_grammar, parse_tools, render_messages, tool_mode

MAX_N = 64  # more choices than this per request is almost surely a client bug


def _accepts_none(field: FieldInfo) -> bool:
    return field.annotation is Any or type(None) in get_args(field.annotation)


class _Request(BaseModel):
    # strict: no coercion between types ("3" is not an integer, true is not 1), as OpenAI
    # rejects them; in JSON an integer is still a valid number.
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        # Clients send `"n": null`, `"stream": null`, ... for "not set". Fields where null is a
        # value keep it (completions' `max_tokens: null` is "no limit", as in vLLM).
        if not isinstance(data, dict):
            return data
        return {
            key: value
            for key, value in data.items()
            if value is not None or key not in cls.model_fields or _accepts_none(cls.model_fields[key])
        }


class StreamOptions(_Request):
    include_usage: bool = False


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    # The JSON schema (OpenAPI) states _content_where_required too.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"role": {"not": {"const": "assistant"}}}},
            "then": {
                "required": ["content"],
                "properties": {
                    "content": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1}]}
                },
            },
        }
    )

    # "developer" is OpenAI's newer name for "system"; templates only know "system".
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """An assistant turn's calls: [{"id", "type": "function", "function": {"name", "arguments"}}]."""
    tool_call_id: str | None = None
    """A tool turn's answer to this call."""

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        # Checked before the union: a part it rejects fails against `str` first, and the client
        # would read "Input should be a valid string" for an image.
        if isinstance(content, list):
            for part in content:
                if isinstance(part, TextPart):  # built in code, already validated
                    continue
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text":
                    raise ValueError(f"only text content parts are supported, not {kind!r}")
                if not isinstance(part.get("text"), str):
                    raise ValueError("a text content part needs a string 'text'")
        return content

    @model_validator(mode="after")
    def _content_where_required(self) -> ChatMessage:
        # Only an assistant turn may come without content (OpenAI: when it made tool calls).
        if self.role != "assistant" and not isinstance(self.content, str) and not self.content:
            raise ValueError(f"a {self.role} message needs 'content' (a string or text parts)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    @field_validator("tool_calls")
    @classmethod
    def _function_calls(cls, calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for call in calls or []:
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError("a tool call needs 'function': {'name': ..., 'arguments': ...}")
        return calls

    def to_template(self) -> dict[str, Any]:
        """The message as chat templates take it; tool calls carry their arguments as objects
        (templates that render calls write them out as JSON)."""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}}
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _arguments(arguments: Any) -> Any:
    """A call's arguments as an object: OpenAI sends them as JSON text."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments if arguments is not None else {}


class _SamplingRequest(_Request):
    """Fields shared by chat and completions (OpenAI names plus vLLM-style extensions)."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Extensions (not in OpenAI's API; same names as vLLM's).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    cache_salt: str | None = None
    """Prefix-cache namespace: cached prompt blocks are shared only among requests with the
    same salt (SamplingParams.cache_salt)."""
    logit_bias: dict[str, float] | None = None
    """Token id (a decimal string, as OpenAI takes it) -> bias in [-100, 100]."""
    token_sources: bool = False
    """Each choice also carries `token_sources`: where each output token came from (a draft of
    the head or of context lookup that the target accepted, or the target's own token) and
    where its text ends (docs/api.md, "Token sources")."""
    response_format: dict[str, Any] | None = None
    """OpenAI's: {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}, "strict": ...}} (the schema is always enforced)."""
    # OpenAI features this server does not implement (see _check_supported).
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _max_tokens(self) -> int | None:
        raise NotImplementedError

    def _logprobs(self) -> int | None:
        raise NotImplementedError

    def _check_supported(self) -> None:
        """A client of a feature this server lacks that got free text back would fail later and
        obscurely; a 400 naming the field tells it at once."""
        if self.functions:
            raise InvalidRequestError("functions (function calling) are not supported by this server", "functions")
        if self.stream_options is not None and not self.stream:
            # As OpenAI: usage asked for a stream that is not one would silently go missing.
            raise InvalidRequestError("stream_options is only allowed when stream is true", "stream_options")

    def sampling_params(self, index: int = 0) -> SamplingParams:
        """SamplingParams for choice `index`: choice i of a seeded request uses seed + i,
        so n > 1 gives n different but reproducible samples."""
        self._check_supported()
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "cache_salt": self.cache_salt,
            "logprobs": self._logprobs(),
            "token_sources": self.token_sources,
        }
        kwargs: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if self.top_k == -1:
            kwargs["top_k"] = 0  # OpenAI-style "disabled"
        kwargs["max_tokens"] = self._max_tokens()
        kwargs["seed"] = None if self.seed is None else self.seed + index
        kwargs["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        kwargs["stop_token_ids"] = list(self.stop_token_ids or [])
        kwargs["logit_bias"] = _token_bias(self.logit_bias or {})
        kwargs["grammar"] = self._grammar()
        return SamplingParams(**kwargs)

    def _grammar(self) -> Grammar | None:
        return response_grammar(self.response_format)


def response_grammar(response_format: dict[str, Any] | None) -> Grammar | None:
    """The grammar of OpenAI's response_format (None for text); the schema itself is checked
    by the engine's grammar compiler."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    if kind != "json_schema":
        raise InvalidRequestError(
            f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}", "response_format"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidRequestError(
            "response_format json_schema needs a 'json_schema' object with a 'schema' object", "response_format"
        )
    return Grammar("json_schema", json.dumps(spec["schema"]))  # key order kept: it orders the output


def _token_bias(bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's logit_bias (keys: token ids as decimal strings) with integer keys."""
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise InvalidRequestError(f"logit_bias keys must be token ids as decimal strings, got {key!r}", "logit_bias")
        out[int(key)] = value
    return out


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    parallel_tool_calls: bool | None = None
    """False: a required tool_choice makes exactly one call (default: one or more)."""
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def _max_tokens(self) -> int | None:
        # Chat default: no limit but the context (OpenAI's behaviour).
        if self.max_completion_tokens is not None:
            if self.max_completion_tokens < 1:  # checked here so the error names this field
                raise InvalidRequestError(
                    f"max_completion_tokens must be at least 1, got {self.max_completion_tokens}",
                    "max_completion_tokens",
                )
            return self.max_completion_tokens
        return self.max_tokens

    def _logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", "top_logprobs")
        if not self.logprobs:
            return None
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= 20:
            raise InvalidRequestError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}", "top_logprobs")
        return self.top_logprobs or 0

    def tool_list(self) -> list[Tool]:
        return parse_tools(self.tools)

    def tool_mode(self) -> ToolMode:
        return tool_mode(self.tool_choice, self.tool_list())

    def _grammar(self) -> Grammar | None:
        calls = call_grammar(self.tool_mode(), self.tool_list(), self.parallel_tool_calls is not False)
        if calls is None:
            return response_grammar(self.response_format)
        if response_grammar(self.response_format) is not None:
            raise InvalidRequestError("a response_format cannot be combined with a required or named tool_choice", "response_format")
        return calls

    def template_messages(self, native_tools: bool = False) -> list[dict[str, Any]]:
        """The conversation as the chat template takes it; with tools, see server/tools.py."""
        messages = [m.to_template() for m in self.messages]
        tools = self.tool_list()
        uses_tools = tools or any(m.role == "tool" or m.tool_calls for m in self.messages)
        return render_messages(messages, tools, native_tools) if uses_tools else messages


class CompletionRequest(_SamplingRequest):
    # A string, a list of strings, a list of token ids, or a list of token-id lists: one
    # engine request per prompt per choice.
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's completions default
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def _max_tokens(self) -> int | None:
        return self.max_tokens

    def _logprobs(self) -> int | None:
        return self.logprobs

    def _check_supported(self) -> None:
        super()._check_supported()
        if self.tools and self.tool_choice != "none":
            raise InvalidRequestError("tools are only supported on /v1/chat/completions", "tools")

    def prompts(self) -> list[str | list[int]]:
        if self.echo:
            raise InvalidRequestError("echo is not supported", "echo")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported", "suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidRequestError("best_of other than n is not supported", "best_of")
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TokenizeRequest(_Request):
    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["prompt"]}, {"required": ["messages"]}]}
    )

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


# ---------------------------------------------------------------- responses


class SpecDecodeInfo(BaseModel):
    """Speculative decoding figures for one choice (see docs/api.md)."""

    num_steps: int
    num_draft_tokens: int
    num_accepted_tokens: int
    mean_acceptance_length: float


class TokenSourceOut(BaseModel):
    """One output token's source and the end of its text (eagle_core.outputs.TokenSource)."""

    source: Literal["target", "head", "lookup", "draft"]
    text_end: int
    """The choice's text length, in Unicode code points, once this token's text is in."""


def _sources_field() -> Any:
    """A choice's `token_sources`: only in the body when the request asked for them."""
    return Field(None, exclude_if=lambda value: value is None)


class PromptTokensDetails(BaseModel):
    cached_tokens: int
    """Prompt tokens whose KV came from the prefix cache."""


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class FunctionCall(BaseModel):
    name: str
    arguments: str
    """JSON text."""


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None
    """Left out of the body when there are none, as OpenAI does."""

    @model_serializer(mode="wrap")
    def _without_empty_tool_calls(self, handler) -> dict[str, Any]:
        data = handler(self)
        if data.get("tool_calls") is None:
            data.pop("tool_calls", None)
        return data


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    spec_decode: SpecDecodeInfo | None = None
    token_sources: list[TokenSourceOut] | None = _sources_field()


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    spec_decode: SpecDecodeInfo | None = None
    token_sources: list[TokenSourceOut] | None = _sources_field()


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class DeltaToolCall(ToolCallOut):
    index: int
    """Position of the call in the message's tool_calls (OpenAI's stream accumulates by it)."""


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    spec_decode: SpecDecodeInfo | None = None
    token_sources: list[TokenSourceOut] | None = _sources_field()


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    spec_decode: SpecDecodeInfo | None = None
    token_sources: list[TokenSourceOut] | None = _sources_field()


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "eagle-serve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class StepCostModel(BaseModel):
    plain: dict[int, float] = Field(
        description="seconds of a step whose target computes this many rows (decode tokens and tree nodes)"
    )
    draft: dict[int, float] = Field(
        description="seconds the first draft forward and the tree bookkeeping add to a step, by drafting sequences"
    )
    level: dict[int, float] = Field(description="seconds of each further draft forward, by drafting sequences")
    feed: float = Field(description="seconds per draft entry a sequence owes the head before it drafts again")
    depth: int = Field(description="draft forwards of the largest tree; a tree of n tokens takes min(depth, n - 1)")


class SpeculationPolicyState(BaseModel):
    """The speculation policy's last choice and what it rests on (eagle_core/spec/policy.py)."""

    drafting: int = Field(description="decoding sequences that drafted with the head in the last step")
    tree_nodes: int = Field(description="tokens of each head tree in the last step, root included (0: none)")
    lookup_alone: int = Field(description="sequences allowed a context-lookup chain alone in the last step")
    expected_tokens_per_second: float = Field(description="emitted tokens per second expected of the last choice")
    steps_by_tree_nodes: dict[int, int] = Field(
        description="steps in which the head drafted, by the trees' size (tokens, root included), since start"
    )
    costs: StepCostModel = Field(description="the cost model the choice rests on")
    head_acceptance: dict[str, dict[int, float]] = Field(
        description='head draft tokens accepted per step by tree size (tokens, root included), averaged '
        'over {"greedy"|"sampling"} requests'
    )


class SpeculationDebug(BaseModel):
    policy: SpeculationPolicyState | None = Field(
        description="null without a draft head, or with --spec-max-batch pinning who drafts"
    )


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int | None


class HealthStatus(BaseModel):
    status: Literal["ok", "loading", "failed", "stopped"]


class ErrorInfo(BaseModel):
    # Every key is always present (null when it does not apply), as in OpenAI's errors.
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorInfo
