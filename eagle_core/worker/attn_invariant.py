"""The batch-invariant attention backend of `--deterministic`: each token's output is a function of
its own query and the keys/values it sees, never of the other tokens of the forward.

The other backends run sdpa (or matmuls) over a group's keys padded to the group's longest
sequence, with a tree node's ancestors interleaved with the masked entries of its siblings; the
kernels' reduction order over the keys then depends on the batch (the padded length picks the
blocking) and on whether a token is a tree node or a plainly decoded token. Here:

- Each token lists the KV positions it sees in order (`visible_positions`): positions
  0 .. committed - 1, then its visible tail entries (a tree node: its ancestors, root first). A
  tree node at depth d thus lists the same positions, in the same order, as the token it stands
  for would in plain decoding once the accepted path is moved into place, and a prompt token
  the same whatever chunk of the prompt it was computed in.
- Its key list is cut into chunks of CHUNK positions (the last padded with masked entries).
  Scores and weighted values are products of fixed shapes per (token, KV head) and chunk,
  [G, d] x [d, CHUNK] and [G, CHUNK] x [CHUNK, d], computed as an elementwise product and a sum
  over d (or over the chunk's positions): a reduction of a fixed length whose order does not
  depend on how many tokens the call holds. Not torch.bmm: its library may pick a different
  blocking for a different batch size, so an entry is not a function of its inputs alone
  (tests/unit/test_invariant_attention.py checks a token alone against tiles of several).
  The softmax's max is exact; chunk results are added in chunk order, and the chunks past a
  token's own list add exact zeros. So a longer neighbour, which lengthens the key list of the
  forward, cannot change a token's sums.

Per token it copies its whole key list out of the cache (as the gather backend does per group),
so a prefill chunk of n tokens over a context of L copies about n * L keys and values: the
price of the guarantee (docs/benchmarks.md, "Deterministic mode"). Scores and softmax are float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_core.worker.inputs import ForwardBatch, SeqGroup
from eagle_core.worker.kv_storage import write_kv

CHUNK = 64
"""Key positions per matmul; a token's key list is padded to a multiple of it."""
TOKEN_TILE = 16
"""Tokens whose keys are copied out at once (bounds the copies' memory, not the results)."""


def visible_positions(group: SeqGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """Each new token's visible KV positions in order ([B*Q, L] long, L the group's longest list)
    and how many it has ([B*Q] long); entries past a token's count are 0."""
    batch, num_new = group.shape
    if group.tail_mask is None:
        committed = group.start_pos[:, None] + torch.arange(num_new) + 1  # [B, Q]
        tail = torch.zeros(batch, num_new, 1, dtype=torch.bool)  # [B, Q, 1]
    else:
        committed = group.committed_len.cpu()[:, None].expand(batch, num_new)  # [B, Q]
        tail = group.tail_mask.cpu()  # [B, Q, W]
    count = committed + tail.sum(dim=2)  # [B, Q]
    # visible tail entries first, in increasing order (a stable sort of "not visible")
    order = torch.sort((~tail).to(torch.int8), dim=2, stable=True).indices  # [B, Q, W]
    index = torch.arange(int(count.max()))  # [L]
    rel = index - committed[:, :, None]  # [B, Q, L]
    from_tail = committed[:, :, None] + order.gather(2, rel.clamp(0, tail.shape[2] - 1))  # [B, Q, L]
    positions = torch.where(rel < 0, index, from_tail)
    positions = torch.where(index < count[:, :, None], positions, 0)
    return positions.reshape(batch * num_new, -1), count.reshape(-1)


@dataclass
class InvariantMetadata:
    slot_mapping: torch.Tensor  # [T] long: KV slot of each new token
    key_slots: torch.Tensor  # [T, L] long: slots of each token's visible positions, in order; L % CHUNK == 0
    key_count: torch.Tensor  # [T] long: visible positions of each token (the rest of its row is padding)
    key_count_host: list[int]

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
        q = query[0].transpose(0, 1)  # [T, heads, head_dim]
        num_tokens = q.shape[0]
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)  # [T, heads, head_dim]
        for start in range(0, num_tokens, TOKEN_TILE):
            stop = min(start + TOKEN_TILE, num_tokens)
            length = -(-max(self.key_count_host[start:stop]) // CHUNK) * CHUNK
            out[start:stop] = token_attention(
                q[start:stop], kv[layer, 0], kv[layer, 1], self.key_slots[start:stop, :length],
                self.key_count[start:stop], scale,
            )
        return out.to(query.dtype)[None]


def token_attention(
    q: torch.Tensor,  # [t, heads, d]
    keys: torch.Tensor,  # [slots, kv_heads, d]
    values: torch.Tensor,  # [slots, kv_heads, d]
    key_slots: torch.Tensor,  # [t, L] long, L a multiple of CHUNK
    key_count: torch.Tensor,  # [t] long
    scale: float | None,
) -> torch.Tensor:  # [t, heads, d] float32
    """Each token's attention over its own key list, in fixed-shape chunks (module docstring)."""
    t, heads, d = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads  # query head h reads KV head h // group
    length = key_slots.shape[1]
    k = keys[key_slots].float()  # [t, L, kv_heads, d]
    v = values[key_slots].float()  # [t, L, kv_heads, d]
    grouped = (q.float() * (scale or d**-0.5)).reshape(t * kv_heads, group, d)  # [t*kv, G, d]
    k = k.permute(0, 2, 1, 3).reshape(t * kv_heads, length, d)  # [t*kv, L, d]
    v = v.permute(0, 2, 1, 3).reshape(t * kv_heads, length, d)  # [t*kv, L, d]
    scores = torch.cat(
        [(grouped[:, :, None, :] * k[:, None, c : c + CHUNK, :]).sum(dim=3) for c in range(0, length, CHUNK)],
        dim=2,
    )  # [t*kv, G, L]
    visible = (torch.arange(length, device=q.device) < key_count[:, None]).repeat_interleave(kv_heads, 0)  # [t*kv, L]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=2, keepdim=True))  # [t*kv, G, L], 0 where masked
    total = torch.zeros(t * kv_heads, group, device=q.device)  # [t*kv, G]
    out = torch.zeros(t * kv_heads, group, d, device=q.device)  # [t*kv, G, d]
    for c in range(0, length, CHUNK):
        chunk = weights[:, :, c : c + CHUNK].contiguous()  # [t*kv, G, CHUNK]
        total = total + chunk.sum(dim=2)
        out = out + (chunk[:, :, :, None] * v[:, None, c : c + CHUNK, :]).sum(dim=2)  # [t*kv, G, d]
    return (out / total[:, :, None]).reshape(t, heads, d)


class InvariantBackend:
    name = "invariant"

    def __init__(self, block_size: int, device: torch.device, trash_slot: int):
        self.block_size = block_size
        self.device = device
        self.trash_slot = trash_slot

    def prepare(self, groups: list[SeqGroup]) -> ForwardBatch:
        """Each token's new slot and its visible key slots in order (module docstring)."""
        size = self.block_size
        offsets, total = [], 0
        new_slots, key_slots, counts = [], [], []
        for group in groups:
            offsets.append(total)
            total += group.num_tokens
            batch, num_new = group.shape
            tables = group.block_tables.cpu()  # [B, MB]
            positions, count = visible_positions(group)  # [B*Q, Lg], [B*Q]
            rows = torch.arange(batch).repeat_interleave(num_new)[:, None]  # [B*Q, 1]
            blocks = tables[rows, (positions // size).clamp(max=tables.shape[1] - 1)]  # [B*Q, Lg]
            slots = blocks * size + positions % size
            visible = torch.arange(positions.shape[1]) < count[:, None]
            key_slots.append(torch.where(visible, slots, self.trash_slot))
            counts.append(count)
            stored = group.start_pos[:, None] + torch.arange(num_new)  # [B, Q]: KV position of each new token
            new_blocks = tables.gather(1, stored // size)  # [B, Q]
            new_slots.append((new_blocks * size + stored % size).reshape(-1))
        length = -(-max(k.shape[1] for k in key_slots) // CHUNK) * CHUNK
        padded = torch.cat(
            [torch.nn.functional.pad(k, (0, length - k.shape[1]), value=self.trash_slot) for k in key_slots]
        )  # [T, L]
        count = torch.cat(counts)  # [T]
        device = self.device
        meta = InvariantMetadata(
            slot_mapping=torch.cat(new_slots).to(device),
            key_slots=padded.to(device),
            key_count=count.to(device),
            key_count_host=count.tolist(),
        )
        input_ids = torch.cat([g.token_ids.reshape(-1).to(device) for g in groups])
        positions = torch.cat([g.rope_positions().reshape(-1).to(device) for g in groups])
        return ForwardBatch(input_ids, positions, meta, offsets, total)
