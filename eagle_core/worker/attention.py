"""Paged, tree-capable attention plugged into transformers' model code.

We keep transformers' own modeling code (projections, RoPE, MLPs, norms) and replace only the
attention call: `register()` adds `attention_forward` to transformers' AttentionInterface, and
models are loaded with `attn_implementation=ATTN_NAME`. Each layer then calls it with the step's
new queries/keys/values; the per-forward metadata (built once per forward by a backend's
`prepare`) and the KV storage's tensor reach it through the forward's **kwargs, which transformers
passes down unchanged.

Backends (`make_backend`), both reading the same paged storage and implementing the same
visibility rule (worker/inputs.py):
- "paged" (worker/attn_paged.py): one fixed set of tensors per forward (flat per-token metadata,
  two buckets of query tiles), sdpa per bucket; made for torch.compile. The default when compiling.
- "gather" (worker/attn_gather.py): copies each group's K/V out and runs sdpa; the reference,
  and the default with --compile off.
- "invariant" (worker/attn_invariant.py): each token over its own key list in fixed-shape
  chunks, so its output does not depend on the rest of the batch; --deterministic's.
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import AttentionInterface

from eagle_core.worker.attn_gather import GatherBackend
from eagle_core.worker.attn_invariant import InvariantBackend
from eagle_core.worker.attn_paged import PagedBackend
from eagle_core.worker.inputs import ForwardBatch, SeqGroup
from eagle_core.worker.kv_storage import KVStorage

ATTN_NAME = "eagle_paged"
BACKENDS = ("paged", "gather", "invariant")


class AttentionBackend(Protocol):
    name: str

    def prepare(self, groups: list[SeqGroup]) -> ForwardBatch:
        """The packed inputs and metadata of one forward (once per forward, on the host)."""
        ...


def make_backend(name: str, block_size: int, kv: KVStorage, shape_buckets: bool = False) -> AttentionBackend:
    """`shape_buckets`: the paged backend pads every dynamic dimension to a power of two (CUDA
    graphs, worker/compiled.py)."""
    if name == "paged":
        return PagedBackend(block_size, kv.kv.device, kv.trash_slot, shape_buckets=shape_buckets)
    if name == "gather":
        return GatherBackend(block_size, kv.kv.device, kv.trash_slot)
    if name == "invariant":
        return InvariantBackend(block_size, kv.kv.device, kv.trash_slot)
    raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}, got {name!r}")


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, T, head_dim]
    key: torch.Tensor,  # [1, kv_heads, T, head_dim]
    value: torch.Tensor,  # [1, kv_heads, T, head_dim]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    eagle_meta=None,
    eagle_kv: torch.Tensor | None = None,  # [layers, 2, slots, kv_heads, head_dim]
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Writes this layer's new K/V into the paged storage and attends; [1, T, heads, head_dim]."""
    if eagle_meta is None or eagle_kv is None:
        raise RuntimeError(f"{ATTN_NAME} attention needs eagle_meta and eagle_kv in the forward kwargs")
    return eagle_meta.attend(module.layer_idx, query, key, value, eagle_kv, scaling), None


def register() -> None:
    AttentionInterface.register(ATTN_NAME, attention_forward)
