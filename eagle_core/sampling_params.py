"""Per-request decoding options, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from eagle_core.errors import InvalidRequestError

GREEDY_BELOW = 1e-5
"""Temperatures below this decode greedily, as in vLLM: logits divided by a temperature near
fp32's smallest numbers overflow to inf and the probabilities to NaN (1e-38 did), and at
1e-5 a token whose logit trails the top one by 1e-3 already has a probability of e^-100."""
MAX_LOGIT_BIAS = 100.0
"""logit_bias values lie in [-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS], OpenAI's range."""
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-6, 1e6
"""Positive logits are divided by the penalty, negative ones multiplied: a penalty near 0 (1e-300
is 0 in fp32) overflows them as a tiny temperature would, and one past fp32's range (1e39 passes
a float64 finiteness check) becomes inf there, so a logit of 0 turns into NaN."""


@dataclass(frozen=True)
class Grammar:
    """What a request's output must match (eagle_core/grammar.py compiles it).

    json_object: any JSON object. json_schema: a JSON document valid under the JSON schema in
    `source` (JSON text). regex: text matching the regular expression in `source` (Rust regex
    syntax, anchored at both ends). Equal grammars compare equal, so they compile once."""

    kind: Literal["json_object", "json_schema", "regex"]
    source: str = ""
    param: str = "response_format"
    """The request field it came from, named by errors about it."""

    def __post_init__(self) -> None:
        if self.kind not in ("json_object", "json_schema", "regex"):
            raise InvalidRequestError(f"unknown grammar kind {self.kind!r}", param=self.param)


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature below GREEDY_BELOW (0 included) means greedy (argmax); the other sampling
    filters are then ignored.
    max_tokens None means "until the context is full". top_k <= 0 disables top-k.
    min_tokens: until that many tokens are out, EOS and stop_token_ids cannot be sampled (their
    probability is zero, draft verification included) and stop strings are not searched for.
    logprobs None returns no log-probabilities; an int k returns the sampled token's log-prob
    plus the k most likely alternatives (from the model's raw distribution).
    logit_bias: (token id, bias) pairs (a dict is accepted), each bias added to that token's
    logit before penalties, temperature and filters, at every sampled position (every draft-tree
    node too, so speculation stays exact); -100 bans a token in practice, +100 forces it.
    grammar: the output must match it (structured outputs): every sampled position, draft-tree
    nodes included, samples only among the tokens the grammar allows there.
    cache_salt: the request's prefix-cache blocks are found only by requests with the same salt
    (None: by requests without one), so a tenant cannot learn from response times what another
    tenant's prompts share with its own. It changes no output.
    token_sources: each RequestOutput carries where its new tokens came from and where each
    one's text ends (RequestOutput.new_token_sources). It changes no token.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    grammar: Grammar | None = None
    cache_salt: str | None = None
    token_sources: bool = False

    def __post_init__(self) -> None:
        # Accept lists from callers but store tuples so the object stays hashable and frozen.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple(sorted((token, value) for token, value in bias)))
        self._validate()

    def _validate(self) -> None:
        def bad(param: str, message: str) -> None:
            raise InvalidRequestError(message, param=param)

        if not 0.0 <= self.temperature <= 2.0:
            bad("temperature", f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 and self.top_k != -1:
            bad("top_k", f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:  # NaN fails too
            bad(
                "repetition_penalty",
                f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] "
                f"(1 = off), got {self.repetition_penalty}",
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            bad("min_tokens", f"min_tokens must be at least 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if len(self.stop) > 16 or any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "stop must be at most 16 non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "stop_token_ids must be non-negative integers")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            bad("logprobs", f"top logprobs must be in [0, 20], got {self.logprobs}")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "seed must be an integer")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            bad("cache_salt", "cache_salt must be a non-empty string")
        for token, value in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                bad("logit_bias", f"logit_bias keys must be non-negative token ids, got {token!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                bad("logit_bias", f"logit_bias values must be numbers in [-100, 100], got {value!r} for token {token}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def adjusts_logits(self) -> bool:
        """Whether the sampled distribution is not the model's own: a bias, a penalty or a
        grammar."""
        return bool(self.logit_bias) or self.needs_penalties or self.grammar is not None

    @property
    def needs_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )
