"""What the engine hands back to its callers (the offline LLM and the server)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle_core.batch import TokenLogprob


@dataclass
class SpecStats:
    """Cumulative speculative-decoding figures for one request."""

    num_steps: int = 0
    """Target forwards that produced tokens for this request (decode steps)."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0
    """Tokens produced by decode steps (accepted + bonus), the numerator of acceptance length."""

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per target forward, bonus token included (1.0 without speculation)."""
        return self.num_emitted_tokens / self.num_steps if self.num_steps else 0.0


@dataclass(frozen=True)
class TokenSource:
    """Where one output token came from, and where its text ends."""

    source: str
    """eagle_core.batch's TARGET_SOURCE, HEAD_SOURCE, LOOKUP_SOURCE or DRAFT_SOURCE."""
    text_end: int
    """Length of the request's output text, in Unicode code points, once this token's text is
    in: token k's text is text[sources[k - 1].text_end : sources[k].text_end]. A token that
    ends inside a character has none of its own (the character counts for the token that
    completes it). A stop string cuts the text and the ends of its step's tokens; an end sent
    in an earlier step may then pass the final text (its text was held back, never sent), so a
    reader clamps ends to the text it has."""


@dataclass
class RequestOutput:
    """One step's news for one request: what is new since the previous output."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    """Valid UTF-8 text delta; never contains a stop string or text after it."""
    finished: bool
    finish_reason: str | None
    """"stop" (EOS, stop id or stop string), "length", or "abort"."""
    num_prompt_tokens: int
    num_output_tokens: int
    """Completion tokens so far (after any stop cut)."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache."""
    new_logprobs: list[TokenLogprob] | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    num_draft_tokens_step: int = 0
    """Draft tokens verified for this request in this step (0: no tree this step)."""
    num_accepted_tokens_step: int = 0
    """Draft tokens accepted in this step; acceptance length of the step = this + 1."""
    new_token_sources: list[TokenSource] | None = None
    """One per new token when SamplingParams.token_sources, else None."""
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
