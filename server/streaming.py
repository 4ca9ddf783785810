"""Server-sent event streams for chat and completions (sse-starlette).

Event order per stream:
  chat only: one chunk per choice carrying {"role": "assistant", "content": ""};
  content chunks with text deltas (and logprobs and token_sources when asked);
  one final chunk per choice: empty delta, finish_reason and `spec_decode`;
  a usage chunk (choices: []) when stream_options.include_usage is set;
  `data: [DONE]`.
The stream only starts after the engine accepted the request, so queue-full and validation
errors are plain HTTP errors, never events inside a 200 stream. When the client disconnects,
sse-starlette cancels the generator and its `finally` aborts the engine requests, which frees
their KV at the engine's next step. When the server stops (SIGTERM), a running stream goes on
until the drain's deadline (server/shutdown.py); one still running then ends with a
`server_shutdown` error event and `data: [DONE]` rather than a connection cut mid-answer.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from sse_starlette import EventSourceResponse

from server.choices import (
    ChoiceState,
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
    sources_out,
    spec_info,
    tool_call_out,
    usage_of,
)
from server.engine_client import EngineStepError, RequestStream
from server.errors import error_body
from server.metrics import StreamObserver
from server.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChunk,
    CompletionChunkChoice,
    DeltaMessage,
    DeltaToolCall,
)
from server.shutdown import Drain
from server.tools import Tool, ToolMode, ToolStream

logger = logging.getLogger(__name__)

DONE = {"data": "[DONE]"}


@dataclass
class StreamMeta:
    """What every chunk of one response repeats."""

    id: str
    created: int
    model: str
    n: int  # choices per prompt
    num_choices: int
    include_usage: bool
    want_logprobs: bool
    token_texts: TokenTexts
    observer: StreamObserver | None = None
    """Times content chunks and records a failure that ends the stream (metrics)."""
    tools: list[Tool] = field(default_factory=list)
    tool_mode: ToolMode = ToolMode("none")
    """Chat with tools: content is held back where tool calls may come (server/tools.py)."""


def _event(chunk: BaseModel, include_usage: bool) -> dict[str, str]:
    data = chunk.model_dump()
    # spec_decode only rides on final chunks; usage only when the client asked for it
    # (OpenAI sends "usage": null on every chunk in that case).
    for choice in data["choices"]:
        if choice.get("spec_decode") is None:
            choice.pop("spec_decode", None)
        if "delta" in choice:  # OpenAI leaves unset delta fields out: {"content": "..."}, then {}
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
    if not include_usage:
        data.pop("usage", None)
    return {"data": json.dumps(data, separators=(",", ":"))}


def event_source(events: AsyncIterator[dict[str, str]]) -> EventSourceResponse:
    return EventSourceResponse(
        events,
        sep="\n",  # matches OpenAI's own stream byte for byte (the default is "\r\n")
    )


async def _guarded(
    stream: RequestStream,
    meta: StreamMeta,
    events: AsyncIterator[dict[str, str]],
    drain: Drain,
) -> AsyncIterator[dict[str, str]]:
    """Abort on disconnect (the generator is cancelled or closed); report engine failure, and a
    stream cut at the shutdown deadline, as a final error event, since the 200 status is already
    on the wire. The deadline also ends a wait for the next event (a stream may be queued, in a
    long prefill, or behind a stalled engine, with no event to wake it)."""
    try:
        while True:
            event = None
            # No yield inside the scope: a cancel scope must not span a generator's suspension.
            with drain.bounded() as waited:
                event = await anext(events, None)
            if waited.cancelled_caught:
                drain.record_cut()
                body = error_body(
                    "The server is shutting down; the answer was cut short", "server_error", None, "server_shutdown"
                )
                yield {"data": json.dumps(body)}
                yield DONE
                return
            if event is None:
                return
            yield event
    except EngineStepError:
        logger.warning("engine failed during a stream; ending it with an error event")
        if meta.observer is not None:
            meta.observer.on_failure("internal_error")
        body = error_body("Internal server error", "server_error", None, "internal_error")
        yield {"data": json.dumps(body)}
        yield DONE
    finally:
        stream.abort()


def chat_stream(stream: RequestStream, meta: StreamMeta, drain: Drain) -> EventSourceResponse:
    return event_source(_guarded(stream, meta, _chat_events(stream, meta), drain))


def completion_stream(stream: RequestStream, meta: StreamMeta, drain: Drain) -> EventSourceResponse:
    return event_source(_guarded(stream, meta, _completion_events(stream, meta), drain))


async def _chat_events(stream: RequestStream, meta: StreamMeta) -> AsyncIterator[dict[str, str]]:
    def chunk(choice: ChatChunkChoice) -> dict[str, str]:
        return _event(
            ChatCompletionChunk(
                id=meta.id, created=meta.created, model=meta.model, choices=[choice]
            ),
            meta.include_usage,
        )

    states = [ChoiceState() for _ in range(meta.num_choices)]
    held = [ToolStream(meta.tool_mode, meta.tools) if meta.tool_mode.kind != "none" else None for _ in states]
    for i in range(meta.num_choices):
        yield chunk(ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content="")))
    async for i, out in stream:
        states[i].update(out)
        text = held[i].content(states[i].text) if held[i] is not None else out.new_text
        if text or (meta.want_logprobs and out.new_logprobs) or out.new_token_sources:
            logprobs = (
                chat_logprobs(out.new_logprobs, meta.token_texts)
                if meta.want_logprobs and out.new_logprobs
                else None
            )
            _observe_chunk(meta, i)
            yield chunk(
                ChatChunkChoice(
                    index=i,
                    delta=DeltaMessage(content=text),
                    logprobs=logprobs,
                    token_sources=sources_out(out.new_token_sources),
                )
            )
        if out.finished:
            finish_reason = out.finish_reason
            if held[i] is not None:
                rest, calls, finish_reason = held[i].finish(states[i].text, out.finish_reason)
                if rest:
                    yield chunk(ChatChunkChoice(index=i, delta=DeltaMessage(content=rest)))
                if calls:
                    deltas = [DeltaToolCall(index=k, **tool_call_out(c).model_dump()) for k, c in enumerate(calls)]
                    yield chunk(ChatChunkChoice(index=i, delta=DeltaMessage(tool_calls=deltas)))
            yield chunk(
                ChatChunkChoice(
                    index=i,
                    delta=DeltaMessage(),
                    finish_reason=finish_reason,
                    spec_decode=spec_info(out.spec),
                )
            )
    if meta.include_usage:
        yield _usage_event(ChatCompletionChunk, meta, states)
    yield DONE


async def _completion_events(
    stream: RequestStream, meta: StreamMeta
) -> AsyncIterator[dict[str, str]]:
    def chunk(choice: CompletionChunkChoice) -> dict[str, str]:
        return _event(
            CompletionChunk(id=meta.id, created=meta.created, model=meta.model, choices=[choice]),
            meta.include_usage,
        )

    states = [ChoiceState() for _ in range(meta.num_choices)]
    async for i, out in stream:
        offset = len(states[i].text)
        states[i].update(out)
        if out.new_text or (meta.want_logprobs and out.new_logprobs) or out.new_token_sources:
            logprobs = (
                completion_logprobs(out.new_logprobs, meta.token_texts, offset)
                if meta.want_logprobs and out.new_logprobs
                else None
            )
            _observe_chunk(meta, i)
            yield chunk(
                CompletionChunkChoice(
                    index=i, text=out.new_text, logprobs=logprobs, token_sources=sources_out(out.new_token_sources)
                )
            )
        if out.finished:
            yield chunk(
                CompletionChunkChoice(
                    index=i,
                    text="",
                    finish_reason=out.finish_reason,
                    spec_decode=spec_info(out.spec),
                )
            )
    if meta.include_usage:
        yield _usage_event(CompletionChunk, meta, states)
    yield DONE


def _observe_chunk(meta: StreamMeta, index: int) -> None:
    if meta.observer is not None:
        meta.observer.on_chunk(index, time.monotonic())


def _usage_event(cls: Any, meta: StreamMeta, states: list[ChoiceState]) -> dict[str, str]:
    chunk = cls(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        choices=[],
        usage=usage_of(states, meta.n),
    )
    return _event(chunk, include_usage=True)
