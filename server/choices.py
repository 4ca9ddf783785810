"""Turning engine RequestOutputs into OpenAI choices: text, logprobs, usage, spec_decode.

Shared by the plain (routes.py) and streaming (streaming.py) paths so both report exactly the
same numbers. A client request may fan out to several engine requests: choice i of prompt p is
engine request `p * n + i`, and usage counts each prompt once (as OpenAI does for n > 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from eagle_core.batch import TokenLogprob
from eagle_core.outputs import RequestOutput, SpecStats
from server.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    SpecDecodeInfo,
    TopLogprob,
    Usage,
)


class TokenTexts:
    """Token id -> its text for logprobs, cached (a vocabulary is at most ~10^5 entries)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._decode([token_id])
            self._cache[token_id] = text
        return text


@dataclass
class ChoiceState:
    """Everything one choice has produced so far."""

    text: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    finish_reason: str | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def update(self, out: RequestOutput) -> None:
        self.text += out.new_text
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_output_tokens = out.num_output_tokens
        self.spec = out.spec
        if out.new_logprobs:
            self.logprobs.extend(out.new_logprobs)
        if out.finished:
            self.finish_reason = out.finish_reason


def spec_info(spec: SpecStats) -> SpecDecodeInfo:
    return SpecDecodeInfo(
        num_steps=spec.num_steps,
        num_draft_tokens=spec.num_draft_tokens,
        num_accepted_tokens=spec.num_accepted_tokens,
        mean_acceptance_length=round(spec.mean_acceptance_length, 4),
    )


def usage_of(states: list[ChoiceState], n: int) -> Usage:
    prompt = sum(states[i].num_prompt_tokens for i in range(0, len(states), n))
    completion = sum(s.num_output_tokens for s in states)
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def _top(token_texts: TokenTexts, token_id: int, logprob: float) -> TopLogprob:
    text = token_texts(token_id)
    return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))


def chat_logprobs(items: list[TokenLogprob], token_texts: TokenTexts) -> ChatLogprobs:
    content = []
    for item in items:
        head = _top(token_texts, item.token_id, item.logprob)
        tops = [_top(token_texts, tid, lp) for tid, lp in item.top]
        content.append(ChatTokenLogprob(**head.model_dump(), top_logprobs=tops))
    return ChatLogprobs(content=content)


def completion_logprobs(
    items: list[TokenLogprob], token_texts: TokenTexts, start_offset: int = 0
) -> CompletionLogprobs:
    """OpenAI's legacy shape; text_offset counts characters from the start of the completion."""
    out = CompletionLogprobs()
    offset = start_offset
    for item in items:
        text = token_texts(item.token_id)
        out.tokens.append(text)
        out.token_logprobs.append(item.logprob)
        out.top_logprobs.append({token_texts(tid): lp for tid, lp in item.top})
        out.text_offset.append(offset)
        offset += len(text)
    return out
