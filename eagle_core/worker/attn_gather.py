"""The reference attention backend: copy each group's keys/values out of the paged cache, then
one `scaled_dot_product_attention` per group.

Simple and obviously right, which is what tests compare the fast backend against, and it runs
eagerly (`--compile off`). Its host cost grows with the groups (a mask and a gather per group and
layer) and every layer copies every sequence's whole context, so it is not the serving default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eagle_core.worker.inputs import ForwardBatch, SeqGroup
from eagle_core.worker.kv_storage import gather_kv, write_kv


@dataclass
class GatherGroup:
    query_index: torch.Tensor  # [B, Q] long: positions of each sequence's new tokens in the packed row
    key_slots: torch.Tensor  # [B, L] long: KV slots of positions 0..L-1 (padding points at slot 0)
    mask: torch.Tensor | None  # [B, 1, Q, L] bool: True where query may attend key; None = all
    first_token: int
    """The group's queries are packed positions first_token .. first_token + B*Q - 1, in order."""


@dataclass
class GatherMetadata:
    slot_mapping: torch.Tensor  # [T] long: KV slot of each new token
    groups: list[GatherGroup]

    def attend(
        self,
        layer: int,
        query: torch.Tensor,  # [1, heads, T, head_dim]
        key: torch.Tensor,  # [1, kv_heads, T, head_dim]
        value: torch.Tensor,  # [1, kv_heads, T, head_dim]
        kv: torch.Tensor,  # [layers, 2, slots, kv_heads, head_dim]
        scale: float | None,
    ) -> torch.Tensor:  # [1, T, heads, head_dim]
        write_kv(kv, layer, self.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
        outputs = []
        for group in self.groups:
            batch, q_len = group.query_index.shape
            start, stop = group.first_token, group.first_token + batch * q_len
            # [heads, B*Q, head_dim] -> [B, heads, Q, head_dim]
            q = query[0, :, start:stop].reshape(query.shape[1], batch, q_len, -1).transpose(0, 1)
            k, v = gather_kv(kv, layer, group.key_slots)  # [B, kv_heads, L, head_dim]
            if q_len == 1 and q.device.type == "cpu":
                o = single_query_attention(q, k, v, group.mask, scale)
            else:
                o = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=group.mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
                )  # [B, heads, Q, head_dim]
            outputs.append(o.transpose(1, 2).reshape(batch * q_len, query.shape[1], -1))  # [B*Q, heads, d]
        return torch.cat(outputs).unsqueeze(0)


def single_query_attention(
    q: torch.Tensor,  # [B, heads, 1, head_dim]
    k: torch.Tensor,  # [B, kv_heads, L, head_dim]
    v: torch.Tensor,  # [B, kv_heads, L, head_dim]
    mask: torch.Tensor | None,  # [B, 1, 1, L] bool
    scale: float | None,
) -> torch.Tensor:
    """Attention for one new token per sequence as two batched float32 matmuls: sdpa's CPU
    kernel is several times slower for a single query (docs/benchmarks.md, "Attention").
    Scores and softmax are float32, as sdpa accumulates them."""
    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    # Query head h reads KV head h // (heads // kv_heads), so a reshape groups them: [B, kv, G, d].
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).float()
    scores = grouped @ k.float().transpose(-1, -2) * (scale or head_dim**-0.5)  # [B, kv, G, L]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = scores.softmax(dim=-1) @ v.float()  # [B, kv, G, d]
    return out.to(q.dtype).reshape(batch, heads, 1, head_dim)


class GatherBackend:
    name = "gather"

    def __init__(self, block_size: int, device: torch.device, trash_slot: int):
        self.block_size = block_size
        self.device = device

    def prepare(self, groups: list[SeqGroup]) -> ForwardBatch:
        offsets, total = [], 0
        for group in groups:
            offsets.append(total)
            total += group.num_tokens
        device = self.device
        input_ids = torch.cat([g.token_ids.reshape(-1).to(device) for g in groups])
        positions = torch.cat([g.rope_positions().reshape(-1).to(device) for g in groups])
        slot_mapping = torch.empty(total, dtype=torch.long, device=device)
        meta_groups = []
        for group, offset in zip(groups, offsets):
            meta_group, new_slots = self._group(group, offset)
            slot_mapping[offset : offset + group.num_tokens] = new_slots.reshape(-1)
            meta_groups.append(meta_group)
        return ForwardBatch(input_ids, positions, GatherMetadata(slot_mapping, meta_groups), offsets, total)

    def _group(self, group: SeqGroup, offset: int) -> tuple[GatherGroup, torch.Tensor]:
        """One sdpa group and its new tokens' slots [B, Q]."""
        device, block_size = self.device, self.block_size
        batch, q_len = group.shape
        key_len = group.key_len
        tables = group.block_tables.to(device)
        cols = torch.arange(key_len, device=device)  # [L]
        block_index = (cols // block_size).clamp(max=tables.shape[1] - 1)
        key_slots = tables[:, block_index] * block_size + cols % block_size  # [B, L]
        arange_q = torch.arange(q_len, device=device)
        starts = group.start_pos.to(device)  # [B]
        new_slots = key_slots.gather(1, starts[:, None] + arange_q)  # [B, Q]
        query_index = offset + torch.arange(batch * q_len, device=device).view(batch, q_len)
        if group.tail_mask is None:
            # causal: key column c is visible to new token i iff c <= start + i
            mask = cols[None, None, :] <= (starts[:, None] + arange_q)[:, :, None]  # [B, Q, L]
        else:
            committed = group.committed_len.to(device)  # [B]
            tail_mask = group.tail_mask.to(device)  # [B, Q, W]
            width = tail_mask.shape[2]
            rel = cols[None, :] - committed[:, None]  # [B, L]
            in_tail = (rel >= 0) & (rel < width)
            tail_part = tail_mask.gather(2, rel.clamp(0, width - 1)[:, None, :].expand(batch, q_len, key_len))
            mask = (rel < 0)[:, None, :] | (tail_part & in_tail[:, None, :])  # [B, Q, L]
        # A mask that allows everything (one decoding sequence) is dropped: sdpa then takes its
        # faster unmasked path.
        full = bool(mask.all())
        return GatherGroup(query_index, key_slots, None if full else mask.unsqueeze(1), offset), new_slots
