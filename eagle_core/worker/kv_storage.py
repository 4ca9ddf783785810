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
        # [num_layers, 2 (key, value), num_slots, kv_heads, head_dim]
        self.kv = torch.zeros(num_layers, 2, num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return num_layers * 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def write(self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store new keys/values. slots: [T]; key, value: [T, kv_heads, head_dim]."""
        self.kv[layer, 0].index_copy_(0, slots, key)
        self.kv[layer, 1].index_copy_(0, slots, value)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values at `slots` ([B, L]) as [B, kv_heads, L, head_dim] each."""
        flat = slots.reshape(-1)
        batch, length = slots.shape
        key = self.kv[layer, 0].index_select(0, flat).view(batch, length, *self.kv.shape[-2:])
        value = self.kv[layer, 1].index_select(0, flat).view(batch, length, *self.kv.shape[-2:])
        return key.transpose(1, 2), value.transpose(1, 2)

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy every layer's entries from src to dst slots ([M] each): keeps an accepted path.

        The right-hand side is materialised before the write, so overlapping src/dst are safe."""
        self.kv[:, :, dst_slots] = self.kv[:, :, src_slots]
