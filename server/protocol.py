"""Pydantic models of the OpenAI request and response bodies this server speaks.

Requests ignore unknown fields (as OpenAI's own server does), so newer clients keep working.
Pydantic checks only shapes and types here; value ranges (temperature in [0, 2], ...) are
checked once, by eagle_core.SamplingParams, whose errors name the parameter.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from eagle_core.errors import InvalidRequestError
from eagle_core.sampling_params import SamplingParams

MAX_N = 64  # more choices than this per request is almost surely a client bug


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    # "developer" is OpenAI's newer name for "system"; templates only know "system".
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def to_template(self) -> dict[str, str]:
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.text()}


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

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _max_tokens(self) -> int | None:
        raise NotImplementedError

    def _logprobs(self) -> int | None:
        raise NotImplementedError

    def sampling_params(self, index: int = 0) -> SamplingParams:
        """SamplingParams for choice `index`: choice i of a seeded request uses seed + i,
        so n > 1 gives n different but reproducible samples."""
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
            "logprobs": self._logprobs(),
        }
        kwargs: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if self.top_k == -1:
            kwargs["top_k"] = 0  # OpenAI-style "disabled"
        kwargs["max_tokens"] = self._max_tokens()
        kwargs["seed"] = None if self.seed is None else self.seed + index
        kwargs["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        kwargs["stop_token_ids"] = list(self.stop_token_ids or [])
        return SamplingParams(**kwargs)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def _max_tokens(self) -> int | None:
        # Chat default: no limit but the context (OpenAI's behaviour).
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def _logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", "top_logprobs")
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    def template_messages(self) -> list[dict[str, str]]:
        return [m.to_template() for m in self.messages]


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


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


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


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None
    spec_decode: SpecDecodeInfo | None = None


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


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    spec_decode: SpecDecodeInfo | None = None


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


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
