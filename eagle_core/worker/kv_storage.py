"""Preallocated paged KV storage for one model (the target, or the draft head).

All layers share one tensor `kv` of shape [num_layers, 2, num_slots, kv_heads, head_dim], where
slot = block_id * block_size + offset (see eagle_core/kv.py for block accounting). It is
allocated once against the configured budget: a step writes its new keys/values into their
slots and never concatenates or copies the cache as a whole.

Why not transformers' cache classes: DynamicCache/StaticCache hold one contiguous row per batch
entry and can only crop a suffix, while EAGLE keeps a non-contiguous subset of a step's new tokens
(the accepted path of a tree) and the scheduler needs block-granular allocation and preemption.
transformers' paged cache for continuous batching hard-codes causal masks and one new token per
request per step, so it cannot verify trees (see ../shared/eagle-notes.md).
"""

from __future__ import annotations

import torch


class KVStorage:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.num_slots = num_slots
        """Slots 0 .. num_slots - 1 belong to blocks; one more, `trash_slot`, takes the writes of
        padding tokens (worker/attn_paged.py)."""
        self.trash_slot = num_slots
        # [num_layers, 2 (key, value), num_slots + 1, kv_heads, head_dim]
        self.kv = torch.zeros(num_layers, 2, num_slots + 1, num_kv_heads, head_dim, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy every layer's entries from src to dst slots ([M] each): keeps an accepted path.

        The right-hand side is materialised before the write, so overlapping src/dst are safe."""
        self.kv[:, :, dst_slots] = self.kv[:, :, src_slots]


# The attention backends get the storage's tensor itself (a compiled forward's input), so the
# per-layer operations are functions of it.


def write_kv(kv: torch.Tensor, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """Store new keys/values into `kv` ([layers, 2, slots, kv_heads, head_dim]).
    slots: [T]; key, value: [T, kv_heads, head_dim].

    One index_put_ on the whole tensor, not a copy into a view of it: under torch.compile a
    write into a view of a graph input copies the whole input back, every layer."""
    which = torch.arange(2, device=slots.device)[:, None]  # [2, 1]: key, value
    kv.index_put_((torch.tensor(layer, device=slots.device), which, slots[None, :]), torch.stack([key, value]))


def gather_kv(kv: torch.Tensor, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values at `slots` ([B, L]) as [B, kv_heads, L, head_dim] each (copies)."""
    flat = slots.reshape(-1)
    batch, length = slots.shape
    key = kv[layer, 0].index_select(0, flat).view(batch, length, *kv.shape[-2:])
    value = kv[layer, 1].index_select(0, flat).view(batch, length, *kv.shape[-2:])
    return key.transpose(1, 2), value.transpose(1, 2)
