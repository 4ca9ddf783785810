"""A request as the scheduler tracks it (pure Python)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from functools import cached_property

from eagle_core.batch import token_range
from eagle_core.kv import block_hashes, salt_key
from eagle_core.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_output_tokens: int
    """min(params.max_tokens, room left in the context): the hard cap on output_token_ids."""
    eos_token_ids: frozenset[int] = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    """Tokens of prompt+output whose KV is stored in block_table."""
    block_table: list[int] = field(default_factory=list)
    num_keyed_blocks: int = 0
    """Leading blocks of block_table already offered to the prefix cache (BlockManager.register)."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache when the request was first admitted."""
    cache_keys: list[bytes] = field(default_factory=list, init=False, repr=False)
    """Prefix-cache keys of the leading full blocks hashed so far (see block_keys)."""
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_slice(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of prompt + output."""
        return token_range(self.prompt_token_ids, self.output_token_ids, start, stop)

    def block_keys(self, num_blocks: int, block_size: int) -> list[bytes]:
        """The prefix-cache keys of the first `num_blocks` full blocks of prompt + output (each
        hashed once; the list grows, never changes)."""
        known = self.cache_keys
        if len(known) < num_blocks:
            tokens = self.token_slice(len(known) * block_size, num_blocks * block_size)
            known += block_hashes(tokens, block_size, known[-1] if known else salt_key(self.params.cache_salt))
        return known

    @cached_property
    def stop_token_ids(self) -> frozenset[int]:
        """Tokens that end this request when sampled: EOS (unless ignore_eos) and stop_token_ids.
        Read every step (scheduling and appending), and fixed once the request exists."""
        eos = frozenset() if self.params.ignore_eos else self.eos_token_ids
        return eos | frozenset(self.params.stop_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
