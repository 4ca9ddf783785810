"""Paged, tree-capable attention plugged into transformers' model code.

We keep transformers' own modeling code (projections, RoPE, MLPs, norms) and replace only the
attention call: `register()` adds a function to transformers' AttentionInterface, and the model
is loaded with `attn_implementation=ATTN_NAME`. Each layer then calls `paged_attention` with
the step's new queries/keys/values; per-step metadata (`AttentionMetadata`, built once per step
by the model runner) and the `KVStorage` reach it through the forward's **kwargs, which
transformers passes down to the attention function unchanged.

All sequences of a step are packed into one row of T tokens. Sequences with the same number of
new tokens form a group that shares one sdpa call (all decoding sequences of a step usually form
one group; each prefill chunk tends to be its own group), so there is no query padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_NAME = "eagle_paged"


@dataclass
class AttnGroup:
    query_index: torch.Tensor  # [B, Q] long: positions of each sequence's new tokens in the packed row
    key_slots: torch.Tensor  # [B, L] long: KV slots of positions 0..L-1 (padding points at slot 0)
    mask: torch.Tensor | None  # [B, 1, Q, L] bool: True where query may attend key; None = all
    first_token: int | None = None
    """Set when the group's queries are the packed positions first_token .. first_token + B*Q - 1
    in order (always the case for a single group): queries and outputs are then plain views."""


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: KV slot of each new token
    groups: list[AttnGroup]


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, heads, T, head_dim]
    key: torch.Tensor,  # [1, kv_heads, T, head_dim]
    value: torch.Tensor,  # [1, kv_heads, T, head_dim]
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    eagle_meta: AttentionMetadata | None = None,
    eagle_kv=None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if eagle_meta is None or eagle_kv is None:
        raise RuntimeError(f"{ATTN_NAME} attention needs eagle_meta and eagle_kv in the forward kwargs")
    layer = module.layer_idx
    # [T, kv_heads, head_dim] each
    eagle_kv.write(layer, eagle_meta.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
    num_tokens = query.shape[2]
    out = query.new_empty(num_tokens, query.shape[1], query.shape[3])  # [T, heads, head_dim]
    for group in eagle_meta.groups:
        batch, q_len = group.query_index.shape
        if group.first_token is not None:  # a contiguous run: slice instead of gather/scatter
            start, stop = group.first_token, group.first_token + batch * q_len
            # [heads, B*Q, head_dim] -> [B, heads, Q, head_dim]
            q = query[0, :, start:stop].view(query.shape[1], batch, q_len, -1).transpose(0, 1)
        else:
            q = query[0][:, group.query_index].transpose(0, 1)  # [B, heads, Q, head_dim]
        k, v = eagle_kv.gather(layer, group.key_slots)  # [B, kv_heads, L, head_dim]
        if q_len == 1 and q.device.type == "cpu":
            o = single_query_attention(q, k, v, group.mask, scaling)
        else:
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=group.mask, scale=scaling, enable_gqa=q.shape[1] != k.shape[1]
            )  # [B, heads, Q, head_dim]
        o = o.transpose(1, 2).reshape(-1, *out.shape[1:])  # [B*Q, heads, head_dim]
        if group.first_token is not None:
            if len(eagle_meta.groups) == 1:
                return o.unsqueeze(0), None  # [1, T, heads, head_dim]
            out[start:stop] = o
        else:
            out[group.query_index.reshape(-1)] = o
    return out.unsqueeze(0), None  # [1, T, heads, head_dim], as transformers expects


def single_query_attention(
    q: torch.Tensor,  # [B, heads, 1, head_dim]
    k: torch.Tensor,  # [B, kv_heads, L, head_dim]
    v: torch.Tensor,  # [B, kv_heads, L, head_dim]
    mask: torch.Tensor | None,  # [B, 1, 1, L] bool
    scale: float | None,
) -> torch.Tensor:
    """Attention for one new token per sequence (decoding) as two batched float32 matmuls.

    Written by hand because sdpa's CPU kernel is slow for this shape: in bf16 a single query
    took 124 vs 45 us per call at batch 1 and 300 keys, 1,730 vs 270 us at batch 16 (`python -m
    bench.attention`; sdpa wins by a few us below ~50 keys). sdpa on float32 copies was quicker
    at batch 1-4 but 8x slower than this at batch 16-64. Decoding calls this once per layer per
    step. Scores and softmax are float32, as sdpa accumulates them."""
    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    # Query head h reads KV head h // (heads // kv_heads), so a reshape groups them: [B, kv, G, d].
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).float()
    scores = grouped @ k.float().transpose(-1, -2) * (scale or head_dim**-0.5)  # [B, kv, G, L]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = scores.softmax(dim=-1) @ v.float()  # [B, kv, G, d]
    return out.to(q.dtype).reshape(batch, heads, 1, head_dim)


def register() -> None:
    AttentionInterface.register(ATTN_NAME, paged_attention)
