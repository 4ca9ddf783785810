"""The two contracts between the scheduler and the worker.

`ScheduledBatch` goes from scheduler to worker, `StepResult` comes back. Both are plain Python:
the scheduler never sees a tensor, the worker never sees scheduler state.

Vocabulary used throughout:
- a sequence's tokens are `prompt_token_ids + output_token_ids`;
- `num_computed_tokens` of them already have KV entries in the sequence's blocks;
- a step computes `token_ids = all_tokens[start_pos : start_pos + len(token_ids)]`;
- when the step reaches the end of the known tokens (`sample=True`) the worker produces new
  tokens: one without speculation, or the accepted draft tokens plus one bonus token with it.
  For a speculative step the worker may also write KV for up to `num_draft_slots` draft tokens
  after `token_ids`; afterwards only the accepted ones are kept, compacted right after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle_core.sampling_params import SamplingParams


def token_range(prompt_token_ids: list[int], output_token_ids: list[int], start: int, stop: int) -> list[int]:
    """Tokens [start, stop) of prompt + output, without building the whole list."""
    num_prompt = len(prompt_token_ids)
    if stop <= num_prompt:
        return prompt_token_ids[start:stop]
    if start >= num_prompt:
        return output_token_ids[start - num_prompt : stop - num_prompt]
    return prompt_token_ids[start:] + output_token_ids[: stop - num_prompt]


@dataclass
class SeqWork:
    """One sequence's share of a step."""

    request_id: str
    token_ids: list[int]
    """Tokens whose KV this step computes (a prefill chunk, or the one last sampled token)."""
    start_pos: int
    """Position of token_ids[0]; equals the number of tokens already in this sequence's KV."""
    block_table: list[int]
    """KV blocks of this sequence, covering start_pos + len(token_ids) + num_draft_slots tokens."""
    sample: bool
    """True when token_ids end at the last known token: the worker must return new tokens."""
    num_draft_slots: int
    """KV slots reserved past token_ids for this step's draft tree (0 = plain decoding): the
    draft head's tree (`num_tree_slots`), then context lookup's tokens (spec/lookup.py) where
    budget was left."""
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    """The live lists (not copies): read-only for the worker, used for penalties."""
    max_new_tokens: int
    """Most tokens the worker may return this step (max_tokens and context length left)."""
    stop_token_ids: frozenset[int] = frozenset()
    """Tokens that end this request (EOS unless ignore_eos, and params.stop_token_ids): sampling
    holds them back until params.min_tokens tokens are out."""
    cache_keys: list[bytes] = field(default_factory=list)
    """The request's live list of prefix-cache keys (kv.block_hashes) of its leading full
    blocks, as far as they were hashed (at least its computed blocks while caching is on;
    empty without caching). Read-only for the worker."""
    num_preemptions: int = 0
    """Times the sequence was preempted: its KV was freed and is being recomputed (or taken from
    the prefix cache) since the last change; state the worker derived from it starts over."""
    num_tree_slots: int = 0
    """Of num_draft_slots, those of the draft head's tree: its nodes past the root (the size the
    speculation policy chose for this step, or less where KV room or budget fell short)."""
    draft_skip_reason: str | None = None
    """Why a decode step of a speculating engine gets no tree from the draft head ("length_cap",
    "token_budget", "batch_size", "kv_cache"); None otherwise. A "batch_size" step may still
    hold slots for context lookup's tokens."""

    @property
    def is_decode(self) -> bool:
        """Computes only the last sampled token's KV: a decode step. A prompt's last token,
        even alone (a 1-token prompt, a chunked prompt's last chunk), is prefill: it gives
        the first output token, and prefill steps never draft."""
        return self.sample and len(self.token_ids) == 1 and self.start_pos >= len(self.prompt_token_ids)

    @property
    def holds_back_stop_tokens(self) -> bool:
        """min_tokens is not reached yet, so this step's samples cannot be stop tokens."""
        return len(self.output_token_ids) < self.params.min_tokens

    @property
    def needs_histories(self) -> bool:
        """Sampling reads the tokens before each row: penalties, held-back stop tokens or a
        grammar."""
        return self.params.needs_penalties or self.holds_back_stop_tokens or self.params.grammar is not None

    @property
    def drafts_with_head(self) -> bool:
        """The draft head builds this step's tree (else it is plain decoding, or lookup only)."""
        return self.num_tree_slots > 0 and self.draft_skip_reason is None


@dataclass
class ScheduledBatch:
    seqs: list[SeqWork]
    finished_request_ids: list[str] = field(default_factory=list)
    """Requests finished or aborted since the last step: the worker drops their state."""

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) + s.num_draft_slots for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    """The k most likely (token_id, logprob) at this position, k = params.logprobs."""


TARGET_SOURCE = "target"
"""A token the target sampled itself: a step's bonus token, or the one token of a plain step."""
HEAD_SOURCE = "head"
"""A draft token from the draft head's tree, accepted by the target."""
LOOKUP_SOURCE = "lookup"
"""A draft token from context lookup (spec/lookup.py), accepted by the target."""
DRAFT_SOURCE = "draft"
"""An accepted draft token of a tree a grammar rebuilt, whose source is not tracked."""


@dataclass
class SeqResult:
    request_id: str
    new_token_ids: list[int]
    """Accepted draft tokens followed by the bonus token (just one token without speculation)."""
    num_draft_tokens: int = 0
    """Draft tokens verified this step (tree size minus the root); 0 without speculation."""
    num_accepted_tokens: int = 0
    """Draft tokens accepted; the first num_accepted_tokens of new_token_ids are drafts."""
    logprobs: list[TokenLogprob] | None = None
    accepted_nodes: list[int] = field(default_factory=list)
    """Tree node indices of the accepted drafts (worker-internal: used for KV compaction)."""
    accepted_ranks: list[int] | None = None
    """The accepted drafts' ranks in their step's score order (DraftTree.ranks): a head tree of
    n nodes would have accepted those up to the first of rank n or more. None without a head
    tree, or where the tree's ranks are unknown."""
    draft_sources: list[str] = field(default_factory=list)
    """Where each accepted draft came from (HEAD_SOURCE, LOOKUP_SOURCE or DRAFT_SOURCE), one per
    accepted node; every other token of new_token_ids is the target's own (TARGET_SOURCE)."""

    @property
    def token_sources(self) -> list[str]:
        """One source per token of new_token_ids: the accepted drafts', then the target's."""
        return (self.draft_sources + [TARGET_SOURCE] * len(self.new_token_ids))[: len(self.new_token_ids)]


@dataclass
class StepResult:
    results: dict[str, SeqResult] = field(default_factory=dict)
    """Only sequences with sample=True appear here."""
