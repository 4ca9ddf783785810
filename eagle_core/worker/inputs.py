"""Building one packed forward's inputs from several sequences' new tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_core.worker.attention import AttentionMetadata, AttnGroup


@dataclass
class SeqInput:
    """One sequence's new tokens in a forward.

    New token i is stored at KV position start_pos + i. Its RoPE position is
    rope_positions[i] (defaults to start_pos + i; a draft tree uses context length + depth).
    It attends to every stored position < committed_len (defaults to start_pos), and to the
    positions committed_len + j, j < start_pos + Q - committed_len, where tail_mask[i, j] is
    True. The default tail mask is causal over the new tokens; a verified tree passes its
    ancestor mask; the draft head's deeper tree levels also see earlier levels' entries.
    """

    token_ids: torch.Tensor  # [Q] long
    start_pos: int
    block_table: list[int]
    rope_positions: torch.Tensor | None = None  # [Q] long
    committed_len: int | None = None
    tail_mask: torch.Tensor | None = None  # [Q, start_pos + Q - committed_len] bool

    @property
    def tail_len(self) -> int:
        committed = self.start_pos if self.committed_len is None else self.committed_len
        return self.start_pos + len(self.token_ids) - committed


@dataclass
class ForwardInputs:
    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    meta: AttentionMetadata
    offsets: list[int]
    """offsets[s] = index of sequence s's first new token in the packed row."""


def build_inputs(seqs: list[SeqInput], block_size: int, device: torch.device) -> ForwardInputs:
    offsets, total = [], 0
    for seq in seqs:
        offsets.append(total)
        total += len(seq.token_ids)
    # Draft-tree tensors may already live on the device while plain tokens are built on the
    # host: move each piece before concatenating.
    input_ids = torch.cat([seq.token_ids.to(device) for seq in seqs])
    position_ids = torch.cat(
        [
            seq.rope_positions.to(device)
            if seq.rope_positions is not None
            else torch.arange(seq.start_pos, seq.start_pos + len(seq.token_ids), device=device)
            for seq in seqs
        ]
    )
    slot_mapping = torch.empty(total, dtype=torch.long, device=device)

    by_shape: dict[tuple[int, int], list[int]] = {}
    for index, seq in enumerate(seqs):
        by_shape.setdefault((len(seq.token_ids), seq.tail_len), []).append(index)
    groups = []
    for (q_len, tail_len), members in by_shape.items():
        group, new_slots = _build_group(
            [seqs[m] for m in members], [offsets[m] for m in members], q_len, tail_len, block_size, device
        )
        slot_mapping[group.query_index.reshape(-1)] = new_slots.reshape(-1)
        first = offsets[members[0]]
        if all(offsets[m] == first + i * q_len for i, m in enumerate(members)):
            group.first_token = first
        groups.append(group)
    meta = AttentionMetadata(slot_mapping=slot_mapping, groups=groups)
    return ForwardInputs(input_ids.unsqueeze(0), position_ids.unsqueeze(0), meta, offsets)


def _build_group(
    seqs: list[SeqInput], offsets: list[int], q_len: int, tail_len: int, block_size: int, device: torch.device
) -> tuple[AttnGroup, torch.Tensor]:
    """One attention group (sequences with q_len new tokens and tail_len masked tail positions
    each) and its new tokens' slots [B, Q]."""
    batch = len(seqs)
    starts = torch.tensor([s.start_pos for s in seqs], device=device)  # [B]
    key_len = int(starts.max().item()) + q_len
    num_blocks = -(-key_len // block_size)
    tables = torch.zeros(batch, num_blocks, dtype=torch.long)
    for row, seq in enumerate(seqs):
        used = seq.block_table[:num_blocks]
        tables[row, : len(used)] = torch.tensor(used, dtype=torch.long)
    tables = tables.to(device)
    cols = torch.arange(key_len, device=device)  # [L]
    key_slots = tables[:, cols // block_size] * block_size + cols % block_size  # [B, L]

    arange_q = torch.arange(q_len, device=device)
    query_index = torch.tensor(offsets, device=device)[:, None] + arange_q  # [B, Q]
    new_slots = key_slots.gather(1, starts[:, None] + arange_q)  # [B, Q]

    causal = torch.ones(q_len, q_len, dtype=torch.bool, device=device).tril()  # default tail
    if all(s.tail_mask is None for s in seqs):
        tail_mask = causal.expand(batch, -1, -1)
    else:
        tail_mask = torch.stack(
            [causal if s.tail_mask is None else s.tail_mask.to(device) for s in seqs]
        )  # [B, Q, W]
    committed = torch.tensor(
        [s.start_pos if s.committed_len is None else s.committed_len for s in seqs], device=device
    )  # [B]
    # Key column c is committed context when c < committed, tail position c - committed when
    # that is < W, and padding beyond.
    rel = cols[None, :] - committed[:, None]  # [B, L]
    in_tail = (rel >= 0) & (rel < tail_len)
    tail_part = tail_mask.gather(2, rel.clamp(0, tail_len - 1)[:, None, :].expand(batch, q_len, key_len))
    mask = (rel < 0)[:, None, :] | (tail_part & in_tail[:, None, :])  # [B, Q, L]
    # A mask that allows everything (one decoding sequence) is dropped: sdpa then takes its
    # faster unmasked path.
    full = bool(mask.all())
    return AttnGroup(query_index, key_slots, None if full else mask.unsqueeze(1)), new_slots
