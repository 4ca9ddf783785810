"""The fast attention backend: every new token attends in place over the paged KV cache.

Metadata is flat, one entry per token, so one set of tensors describes prefill chunks, decode
tokens, verified trees and draft-tree levels alike (worker/inputs.py states the visibility rule):

    kv_pos [T]        KV position the token is stored at (-1: a padding token)
    seq_index [T]     its row of block_tables
    committed [T]     it sees every key position < committed (causal tokens: kv_pos + 1)
    tail_mask [T, W]  and position committed + j where tail_mask[t, j] (trees; all False otherwise)
    block_tables [S, MB], key_positions [L] = arange(L)

`attend` is written as reductions over key positions ((q * k).sum over head_dim, softmax over
keys, (p * v).sum over keys) whose key loads index the cache through the block table. Under
torch.compile (inductor) each becomes one loop nest reading K/V where they lie, without copying
the context out per layer; that is the point of this backend, and why it wants compilation
(eagerly the products are materialised: fine for tests on tiny models, not for serving).

Shapes are padded so that no dimension is 0 or 1 (`pad`): torch.compile specialises sizes 0 and
1, and padding keeps one compiled graph for every step. Padding tokens write their K/V to the
storage's trash slot and see key position 0 only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from eagle_core.worker.inputs import ForwardBatch, SeqGroup
from eagle_core.worker.kv_storage import write_kv

MIN_DIM = 2
"""Smallest padded size of every dynamic dimension (see the module docstring)."""


@dataclass
class PagedMetadata:
    kv_pos: torch.Tensor  # [T] long
    seq_index: torch.Tensor  # [T] long
    committed: torch.Tensor  # [T] long
    tail_mask: torch.Tensor  # [T, W] bool
    block_tables: torch.Tensor  # [S, MB] long
    key_positions: torch.Tensor  # [L] long
    block_size: int
    trash_slot: int
    # Derived once per forward by `derive` (inside the compiled region), read by every layer.
    slot_mapping: torch.Tensor | None = None  # [T] long
    key_slots: torch.Tensor | None = None  # [S, L] long
    visible: torch.Tensor | None = None  # [T, L] bool

    def dynamic_tensors(self) -> list[torch.Tensor]:
        return [self.kv_pos, self.seq_index, self.committed, self.tail_mask, self.block_tables, self.key_positions]

    def derive(self) -> PagedMetadata:
        """The per-forward tensors every layer reads: new tokens' slots, key slots, visibility."""
        size = self.block_size
        own_block = self.block_tables[self.seq_index, self.kv_pos.clamp(min=0) // size]  # [T]
        slot_mapping = torch.where(self.kv_pos >= 0, own_block * size + self.kv_pos % size, self.trash_slot)
        key_block = (self.key_positions // size).clamp(max=self.block_tables.shape[1] - 1)  # [L]
        key_slots = self.block_tables[:, key_block] * size + self.key_positions % size  # [S, L]
        rel = self.key_positions[None, :] - self.committed[:, None]  # [T, L]
        width = self.tail_mask.shape[1]
        in_tail = (rel >= 0) & (rel < width)
        tail = self.tail_mask.gather(1, rel.clamp(0, width - 1))
        visible = (rel < 0) | (in_tail & tail)  # [T, L]
        return replace(self, slot_mapping=slot_mapping, key_slots=key_slots, visible=visible)

    def attend(
        self,
        layer: int,
        query: torch.Tensor,  # [1, heads, T, head_dim]
        key: torch.Tensor,  # [1, kv_heads, T, head_dim]
        value: torch.Tensor,  # [1, kv_heads, T, head_dim]
        kv: torch.Tensor,  # [layers, 2, slots, kv_heads, head_dim]
        scale: float | None,
    ) -> torch.Tensor:  # [1, T, heads, head_dim]
        _, heads, num_tokens, head_dim = query.shape
        kv_heads = key.shape[1]
        write_kv(kv, layer, self.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
        slots = self.key_slots[self.seq_index]  # [T, L]
        keys, values = kv[layer, 0], kv[layer, 1]  # [slots, kv_heads, head_dim] each
        # Query head h reads KV head h // G: [T, 1, kv_heads, G, d] against [T, L, kv_heads, 1, d].
        q = query[0].transpose(0, 1).reshape(num_tokens, 1, kv_heads, heads // kv_heads, head_dim).float()
        scores = (q * keys[slots].float()[:, :, :, None, :]).sum(-1) * (scale or head_dim**-0.5)  # [T, L, kv, G]
        scores = scores.masked_fill(~self.visible[:, :, None, None], float("-inf"))
        probs = scores.softmax(dim=1)
        out = (probs[..., None] * values[slots].float()[:, :, :, None, :]).sum(1)  # [T, kv, G, d]
        return out.reshape(1, num_tokens, heads, head_dim).to(query.dtype)


def _padded(size: int) -> int:
    return max(size, MIN_DIM)


class PagedBackend:
    name = "paged"

    def __init__(self, block_size: int, device: torch.device, trash_slot: int):
        self.block_size = block_size
        self.device = device
        self.trash_slot = trash_slot

    def prepare(self, groups: list[SeqGroup]) -> ForwardBatch:
        """Flat metadata for `groups`, padded (see the module docstring), on the device."""
        offsets, total, rows = [], 0, 0
        ids, positions, kv_pos, seq_index, committed, tails = [], [], [], [], [], []
        width = _padded(max((g.tail_mask.shape[2] for g in groups if g.tail_mask is not None), default=1))
        num_blocks = _padded(max(g.block_tables.shape[1] for g in groups))
        key_len = _padded(max(g.key_len for g in groups))
        for group in groups:
            batch, num_new = group.shape
            offsets.append(total)
            total += batch * num_new
            ids.append(group.token_ids.reshape(-1))
            positions.append(group.rope_positions().reshape(-1))
            stored = group.start_pos[:, None] + torch.arange(num_new)  # [B, Q]
            kv_pos.append(stored.reshape(-1))
            seq_index.append((rows + torch.arange(batch)).repeat_interleave(num_new))
            rows += batch
            if group.tail_mask is None:
                committed.append(stored.reshape(-1) + 1)
                tails.append(torch.zeros(batch * num_new, width, dtype=torch.bool))
            else:
                committed.append(group.committed_len[:, None].expand(batch, num_new).reshape(-1))
                tail = group.tail_mask.reshape(batch * num_new, -1).cpu()
                tails.append(torch.nn.functional.pad(tail, (0, width - tail.shape[1])))
        num_pad = _padded(total) - total
        if num_pad:
            ids.append(torch.zeros(num_pad, dtype=torch.long))
            positions.append(torch.zeros(num_pad, dtype=torch.long))
            kv_pos.append(torch.full((num_pad,), -1, dtype=torch.long))
            seq_index.append(torch.zeros(num_pad, dtype=torch.long))
            committed.append(torch.ones(num_pad, dtype=torch.long))
            tails.append(torch.zeros(num_pad, width, dtype=torch.bool))
        tables = torch.zeros(_padded(rows), num_blocks, dtype=torch.long)
        row = 0
        for group in groups:
            batch, used = group.block_tables.shape
            tables[row : row + batch, :used] = group.block_tables
            row += batch
        device = self.device
        meta = PagedMetadata(
            kv_pos=torch.cat(kv_pos).to(device),
            seq_index=torch.cat(seq_index).to(device),
            committed=torch.cat(committed).to(device),
            tail_mask=torch.cat(tails).to(device),
            block_tables=tables.to(device),
            key_positions=torch.arange(key_len, device=device),
            block_size=self.block_size,
            trash_slot=self.trash_slot,
        )
        input_ids = torch.cat([t.to(device) for t in ids])
        return ForwardBatch(input_ids, torch.cat([p.to(device) for p in positions]), meta, offsets, total)
