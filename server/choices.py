"""Turning engine RequestOutputs into OpenAI choices: text, logprobs, usage, spec_decode,
token_sources.

Shared by the plain (routes.py) and streaming (streaming.py) paths so both report exactly the
same numbers. A client request may fan out to several engine requests: choice i of prompt p is
engine request `p * n + i`, and usage counts each prompt once (as OpenAI does for n > 1).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from eagle_core.batch import TokenLogprob
from eagle_core.outputs import RequestOutput, SpecStats, TokenSource
from server.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    FunctionCall,
    PromptTokensDetails,
    SpecDecodeInfo,
    TokenSourceOut,
    ToolCallOut,
    TopLogprob,
    Usage,
)
from server.tools import ToolCall


class TokenTexts:
    """Token id -> its text and its bytes for logprobs, cached (a vocabulary is at most ~10^5
    entries).

    A token can hold part of a character (an emoji is 4 bytes, often two tokens). Its decoded
    text then ends in U+FFFD, and OpenAI's `bytes` field exists for exactly this case: joined
    over the tokens, the bytes must give the text's UTF-8. So the bytes come from the token's
    vocabulary entry where the tokenizer's decoder is known to map it to bytes (`raw_bytes`),
    else from the decoded text. Where they are known and are whole characters, the token's
    text is those bytes too: decoding one SentencePiece token alone strips its leading space
    ("▁hello" -> "hello"), which the text the token adds to a completion has."""

    def __init__(self, decode: Callable[[list[int]], str], raw_bytes: Callable[[int], bytes | None] | None = None):
        self._decode = decode
        self._raw_bytes = raw_bytes
        self._cache: dict[int, tuple[str, bytes]] = {}
        """token id -> (text, bytes)"""

    @classmethod
    def of(cls, tokenizer) -> TokenTexts:
        return cls(tokenizer.decode, _raw_bytes_reader(tokenizer))

    def __call__(self, token_id: int) -> str:
        return self._entry(token_id)[0]

    def bytes(self, token_id: int) -> list[int]:
        return list(self._entry(token_id)[1])

    def legacy_text(self, token_id: int) -> str:
        """The token as completions' legacy logprobs name it: its text, or, for part of a
        character (its bytes are not its text's), "bytes:" and its bytes escaped
        ("bytes:\\xf0\\x9f"), as OpenAI writes them, so that two such tokens do not share one
        top_logprobs key."""
        text, raw = self._entry(token_id)
        if text.encode("utf-8") == raw:
            return text
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)

    def _entry(self, token_id: int) -> tuple[str, bytes]:
        entry = self._cache.get(token_id)
        if entry is None:
            raw = self._raw_bytes(token_id) if self._raw_bytes else None
            try:
                text = raw.decode("utf-8") if raw is not None else self._decode([token_id])
            except UnicodeDecodeError:  # part of a character: U+FFFD, as the tokenizer gives
                text = self._decode([token_id])
            entry = (text, raw if raw is not None else text.encode("utf-8"))
            self._cache[token_id] = entry
        return entry


def _raw_bytes_reader(tokenizer) -> Callable[[int], bytes | None] | None:
    """Token id -> the bytes its vocabulary entry stands for, for the two decoders that map
    entries to bytes: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2: each byte is one printable
    character) and SentencePiece with byte fallback (Llama 2, Mistral: "<0xE2>" entries and "▁"
    for a space). None for other tokenizers, and for added tokens (special tokens), whose text
    is their bytes."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.decoder is None:
        return None
    decoder = json.loads(backend.decoder.__getstate__())
    kinds = {d.get("type") for d in decoder.get("decoders", [decoder])}
    added = set(tokenizer.get_added_vocab().values())

    if "ByteLevel" in kinds:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        byte_of = {char: byte for byte, char in bytes_to_unicode().items()}

        def entry_bytes(piece: str) -> bytes | None:
            if any(c not in byte_of for c in piece):
                return None
            return bytes(byte_of[c] for c in piece)

    elif "ByteFallback" in kinds:

        def entry_bytes(piece: str) -> bytes | None:
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            return piece.replace("\u2581", " ").encode("utf-8")

    else:
        return None

    def raw_bytes(token_id: int) -> bytes | None:
        if token_id in added:
            return None
        piece = tokenizer.convert_ids_to_tokens(token_id)
        return entry_bytes(piece) if isinstance(piece, str) else None

    return raw_bytes


@dataclass
class ChoiceState:
    """Everything one choice has produced so far."""

    text: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    token_sources: list[TokenSource] = field(default_factory=list)

    def update(self, out: RequestOutput) -> None:
        self.text += out.new_text
        self.num_prompt_tokens = out.num_prompt_tokens
        self.num_output_tokens = out.num_output_tokens
        self.num_cached_tokens = out.num_cached_tokens
        self.spec = out.spec
        if out.new_logprobs:
            self.logprobs.extend(out.new_logprobs)
        if out.new_token_sources:
            self.token_sources.extend(out.new_token_sources)
        if out.finished:
            self.finish_reason = out.finish_reason


def tool_call_out(call: ToolCall) -> ToolCallOut:
    return ToolCallOut(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))


def spec_info(spec: SpecStats) -> SpecDecodeInfo:
    return SpecDecodeInfo(
        num_steps=spec.num_steps,
        num_draft_tokens=spec.num_draft_tokens,
        num_accepted_tokens=spec.num_accepted_tokens,
        mean_acceptance_length=round(spec.mean_acceptance_length, 4),
    )


def sources_out(items: list[TokenSource] | None) -> list[TokenSourceOut] | None:
    """The `token_sources` of a choice or chunk; None (left out of the body) when not asked."""
    if items is None:
        return None
    return [TokenSourceOut(source=item.source, text_end=item.text_end) for item in items]


def usage_of(states: list[ChoiceState], n: int) -> Usage:
    """Usage of `states`, n choices per prompt: each prompt counts once (its first choice's
    figures), completions all."""
    firsts = states[::n]
    prompt = sum(s.num_prompt_tokens for s in firsts)
    completion = sum(s.num_output_tokens for s in states)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(s.num_cached_tokens for s in firsts)),
    )


def _top(token_texts: TokenTexts, token_id: int, logprob: float) -> TopLogprob:
    return TopLogprob(token=token_texts(token_id), logprob=logprob, bytes=token_texts.bytes(token_id))


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
    """OpenAI's legacy shape: top_logprobs holds the `logprobs` most likely tokens plus the
    sampled one (up to logprobs + 1 entries); text_offset counts characters from the start of
    the completion."""
    out = CompletionLogprobs()
    offset = start_offset
    for item in items:
        name = token_texts.legacy_text(item.token_id)
        out.tokens.append(name)
        out.token_logprobs.append(item.logprob)
        top = {token_texts.legacy_text(tid): lp for tid, lp in item.top}
        # OpenAI: the sampled token is always among them. Should two tokens share a text (an
        # added token spelled like a vocabulary entry), the sampled one wins.
        top[name] = item.logprob
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(token_texts(item.token_id))
    return out
