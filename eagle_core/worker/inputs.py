"""What one forward computes: groups of sequences whose new tokens have the same shape.

A forward (of the target or of the draft head) packs several `SeqGroup`s into one row of
tokens, group after group, each group row-major ([B, Q] -> B * Q tokens). An attention backend
(worker/attention.py) turns the groups into the tensors its kernels read, once per forward.

Visibility, the one rule every backend implements: new token i of row b is stored at KV position
`start_pos[b] + i` and attends to
- every position <= its own (causal), when the group has no tail mask;
- with a tail mask, every position < committed_len[b], and the positions committed_len[b] + j
  (j < W) where tail_mask[b, i, j] is True. W = start_pos[b] + Q - committed_len[b]: the tail
  ends at the group's last new token. A verified draft tree passes its ancestor mask
  (committed_len = start_pos, W = Q); the draft head's deeper tree levels also see the entries
  of earlier levels (W = level * Q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SeqGroup:
    token_ids: torch.Tensor  # [B, Q] long
    start_pos: torch.Tensor  # [B] long, on the host
    block_tables: torch.Tensor  # [B, MB] long, on the host: KV blocks of each row (0-padded)
    key_len: int
    """Key positions 0 .. key_len - 1 cover every position a token of the group may see."""
    positions: torch.Tensor | None = None  # [B, Q] long RoPE positions; None: start_pos + i
    committed_len: torch.Tensor | None = None  # [B] long; with tail_mask
    tail_mask: torch.Tensor | None = None  # [B, Q, W] bool; None: causal

    @property
    def shape(self) -> tuple[int, int]:
        return self.token_ids.shape[0], self.token_ids.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.token_ids.numel()

    def rope_positions(self) -> torch.Tensor:  # [B, Q] long
        if self.positions is not None:
            return self.positions
        num_new = self.token_ids.shape[1]
        return self.start_pos.to(self.token_ids.device)[:, None] + torch.arange(num_new, device=self.token_ids.device)


def block_table_tensor(tables: list[list[int]], num_blocks: int | None = None) -> torch.Tensor:
    """[len(tables), num_blocks] long, rows 0-padded (num_blocks defaults to the longest)."""
    width = max(1, num_blocks if num_blocks is not None else max((len(t) for t in tables), default=1))
    out = torch.zeros(len(tables), width, dtype=torch.long)
    for row, table in enumerate(tables):
        used = table[:width]
        if used:
            out[row, : len(used)] = torch.tensor(used, dtype=torch.long)
    return out


def causal_group(token_ids: list[list[int]], start_pos: list[int], tables: list[list[int]], block_size: int) -> SeqGroup:
    """B sequences with the same number Q of new tokens, causal (prefill chunks, decode tokens)."""
    num_new = len(token_ids[0])
    key_len = max(start_pos) + num_new
    return SeqGroup(
        token_ids=torch.tensor(token_ids, dtype=torch.long),
        start_pos=torch.tensor(start_pos, dtype=torch.long),
        block_tables=block_table_tensor(tables, -(-key_len // block_size)),
        key_len=key_len,
    )


@dataclass
class ForwardBatch:
    """The packed inputs of one forward, as an attention backend prepared them."""

    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    meta: object
    """The backend's attention metadata; its `attend` runs one layer's attention."""
    offsets: list[int]
    """offsets[g] = index of group g's first token in the packed row."""
    num_tokens: int
    """Real tokens; a backend may pad input_ids past them."""
