"""The two attention backends implement one visibility rule (worker/inputs.py): same outputs and
same KV writes for causal groups, verified trees and draft-tree levels packed together."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from eagle_core.worker import attn_paged
from eagle_core.worker.attn_gather import GatherBackend
from eagle_core.worker.attn_paged import PagedBackend
from eagle_core.worker.cpu_kernels import paged_attention_available
from eagle_core.worker.inputs import SeqGroup, causal_group
from eagle_core.worker.kv_storage import KVStorage

BLOCK = 4
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8

needs_kernel = pytest.mark.skipif(not paged_attention_available(), reason="the CPU kernel could not be built here")
IN_PLACE = partial(PagedBackend, in_place=True)
"""The paged backend with its narrow bucket (decode tokens, trees, draft levels) attending through
the CPU kernel that reads the cache in place."""
SDPA = partial(PagedBackend, in_place=False)
BUCKETED = partial(PagedBackend, in_place=False, shape_buckets=True)
"""The paged backend as CUDA graphs use it: every dynamic dimension padded to a power of two."""


def groups() -> list[SeqGroup]:
    """Two decode tokens, a prefill chunk, two 3-node trees and a draft level with a wide tail."""
    tree_mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    level_tail = torch.zeros(2, 2, 4, dtype=torch.bool)  # [B, K, 2 * K]: level 2 of a top-2 tree
    level_tail[:, 0, 2] = level_tail[:, 1, 3] = True  # each entry sees itself ...
    level_tail[0, 0, 1] = level_tail[0, 1, 0] = level_tail[1, :, 0] = True  # ... and its parent
    return [
        causal_group([[11], [12]], [5, 9], [[0, 1], [2, 3, 4]], BLOCK),
        causal_group([[1, 2, 3, 4, 5, 6]], [3], [[5, 6, 7]], BLOCK),
        SeqGroup(
            token_ids=torch.tensor([[7, 8, 9], [10, 11, 12]]),
            start_pos=torch.tensor([6, 2]),
            block_tables=torch.tensor([[8, 9, 10], [11, 12, 0]]),
            key_len=9,
            positions=torch.tensor([[6, 7, 7], [2, 3, 3]]),
            committed_len=torch.tensor([6, 2]),
            tail_mask=tree_mask.expand(2, 3, 3).clone(),
        ),
        SeqGroup(
            token_ids=torch.tensor([[13, 14], [15, 16]]),
            start_pos=torch.tensor([7, 3]),  # context + K
            block_tables=torch.tensor([[13, 14, 15], [16, 17, 0]]),
            key_len=9,
            positions=torch.tensor([[6, 6], [2, 2]]),
            committed_len=torch.tensor([5, 1]),
            tail_mask=level_tail,
        ),
    ]


def run(backend_cls, seed: int = 0, offset_slots: slice | None = None, dtype: torch.dtype = torch.float32):
    """Attend over groups() with a random cache (slots `offset_slots` shifted by 100)."""
    torch.manual_seed(seed)
    kv = KVStorage(1, 20 * BLOCK, KV_HEADS, HEAD_DIM, dtype, torch.device("cpu"))
    kv.kv.normal_()
    if offset_slots is not None:
        kv.kv[:, :, offset_slots] += 100.0
    batch = backend_cls(BLOCK, torch.device("cpu"), kv.trash_slot).prepare(groups())
    meta = batch.meta.derive() if hasattr(batch.meta, "derive") else batch.meta
    real, pad = batch.num_tokens, batch.input_ids.shape[0] - batch.num_tokens
    query = F.pad(torch.randn(1, HEADS, real, HEAD_DIM), (0, 0, 0, pad)).to(dtype)
    key = F.pad(torch.randn(1, KV_HEADS, real, HEAD_DIM), (0, 0, 0, pad)).to(dtype)
    value = F.pad(torch.randn(1, KV_HEADS, real, HEAD_DIM), (0, 0, 0, pad)).to(dtype)
    out = meta.attend(0, query, key, value, kv.kv, 0.3)[0, : batch.num_tokens]
    return out, kv.kv[:, :, : kv.trash_slot], batch


@pytest.mark.parametrize(
    "paged_backend", [SDPA, BUCKETED, pytest.param(IN_PLACE, marks=needs_kernel)], ids=["sdpa", "bucketed", "in-place"]
)
def test_paged_equals_gather_outputs_and_kv_writes(paged_backend):
    paged, paged_kv, paged_batch = run(paged_backend)
    gather, gather_kv, gather_batch = run(GatherBackend)
    assert paged_batch.num_tokens == gather_batch.num_tokens == 2 + 6 + 6 + 4
    assert torch.equal(paged_batch.input_ids[: paged_batch.num_tokens], gather_batch.input_ids)
    assert torch.equal(paged_batch.positions[: paged_batch.num_tokens], gather_batch.positions)
    torch.testing.assert_close(paged, gather, rtol=1e-5, atol=1e-5)
    assert torch.equal(paged_kv, gather_kv)  # the same slots written, the trash slot aside


def test_shape_buckets_pad_every_dynamic_dimension_to_a_power_of_two():
    _, _, batch = run(BUCKETED)
    sizes = [d for t in [batch.input_ids, *batch.meta.dynamic_tensors()] for d in t.shape]
    assert batch.input_ids.shape[0] == 32  # 18 tokens
    assert all(d >= 2 and d & (d - 1) == 0 for d in sizes), sizes


@needs_kernel
def test_in_place_kernel_reads_a_bfloat16_cache_like_the_reference():
    paged, _, batch = run(IN_PLACE, dtype=torch.bfloat16)
    gather, _, _ = run(GatherBackend, dtype=torch.bfloat16)
    assert batch.meta.in_place
    torch.testing.assert_close(paged.float(), gather.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("paged_backend", [SDPA, pytest.param(IN_PLACE, marks=needs_kernel)], ids=["sdpa", "in-place"])
@pytest.mark.parametrize("tile", [2, 4, 64])
def test_paged_tiling_does_not_change_outputs(monkeypatch, tile, paged_backend):
    """Tiles of 2 or 4 (the 6-token chunk cut, its last tile padded, trees and levels in the wide
    bucket too) or of 64 (the chunk whole): the same outputs."""
    monkeypatch.setattr(attn_paged, "TILE", tile)
    paged, _, paged_batch = run(paged_backend)
    gather, _, _ = run(GatherBackend)
    torch.testing.assert_close(paged, gather, rtol=1e-5, atol=1e-5)
    assert paged_batch.meta.wide.tokens.shape[1] <= max(tile, 6)  # the chunk has 6 tokens


def test_split_keeps_decode_tokens_out_of_a_prefill_chunks_tiles():
    """16 decode tokens and a 300-token chunk: the decode tiles stay 1 wide (padded to 2), the
    chunk is cut into TILE-wide tiles."""
    decode = causal_group([[1]] * 16, [200] * 16, [[0] * 13] * 16, 16)
    chunk = causal_group([list(range(300))], [0], [[0] * 19], 16)
    batch = PagedBackend(16, torch.device("cpu"), 0).prepare([decode, chunk])
    meta = batch.meta
    assert tuple(meta.narrow.tokens.shape) == (16, 2)
    assert tuple(meta.wide.tokens.shape) == (-(-300 // attn_paged.TILE), attn_paged.TILE)
    # every real token's output is read from the slot that holds its query
    slots = torch.cat([meta.narrow.tokens.reshape(-1), meta.wide.tokens.reshape(-1)])
    assert torch.equal(slots[meta.out_index[: batch.num_tokens]], torch.arange(batch.num_tokens))


def test_paged_padding_writes_only_the_trash_slot():
    torch.manual_seed(0)
    kv = KVStorage(1, 4 * BLOCK, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"))
    batch = PagedBackend(BLOCK, torch.device("cpu"), kv.trash_slot).prepare(
        [causal_group([[3]], [2], [[1]], BLOCK)]
    )
    assert batch.input_ids.shape[0] == 2 and batch.num_tokens == 1  # one padding token
    meta = batch.meta.derive()
    assert meta.slot_mapping.tolist() == [1 * BLOCK + 2, kv.trash_slot]
    assert all(min(t.shape) >= 2 for t in meta.dynamic_tensors() if t.dim() > 0)
    ones = torch.ones(1, KV_HEADS, 2, HEAD_DIM)
    meta.attend(0, torch.ones(1, HEADS, 2, HEAD_DIM), ones, ones, kv.kv, None)
    written = kv.kv[0, 0].abs().sum(dim=(1, 2)) > 0
    assert written.nonzero().flatten().tolist() == [1 * BLOCK + 2, kv.trash_slot]


@pytest.mark.parametrize(
    "backend", [SDPA, pytest.param(IN_PLACE, marks=needs_kernel), GatherBackend], ids=["sdpa", "in-place", "gather"]
)
def test_a_causal_token_ignores_keys_past_its_position(backend):
    """Changing the cache beyond a decode token's position (a stale entry of a longer, freed
    sequence) leaves its output unchanged."""
    first, _, _ = run(backend)
    again, _, _ = run(backend, offset_slots=slice(1 * BLOCK + 2, 2 * BLOCK))  # positions 6-7 of the first sequence
    torch.testing.assert_close(again[0], first[0])
    visible, _, _ = run(backend, offset_slots=slice(1 * BLOCK, 1 * BLOCK + 1))  # position 4: seen
    assert not torch.allclose(visible[0], first[0])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tiles", "width", "head_dim"), [(3, 1, 64), (2, 11, 64), (2, 5, 128), (1, 3, 40), (2, 40, 64)])
def test_in_place_kernel_equals_sdpa_over_gathered_keys(dtype, tiles, width, head_dim):
    """The kernel on its own against sdpa over the same keys gathered: SmolLM2's head grouping
    (9 query heads, 3 KV heads), key counts that are not a multiple of a vector, query rows past
    a register block, head sizes that are and are not a multiple of its output span, tiles wide
    enough to go through its gather + sdpa path, keys scattered over the cache, and a query slot
    that sees no key (zeros)."""
    torch.manual_seed(0)
    heads, kv_heads, keys, slots = 9, 3, 37, 200
    key_cache = torch.randn(slots, kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(slots, kv_heads, head_dim).to(dtype)
    key_slots = torch.stack([torch.randperm(slots)[:keys] for _ in range(tiles)])  # [N, L]
    visible = torch.rand(tiles, width, keys) < 0.7  # [N, Q, L]
    visible[:, :, 0] = True
    visible[0, 0] = False  # sees nothing
    query = torch.randn(tiles, width, heads, head_dim)
    # the 40-wide case goes through the operator's gather + sdpa path, the others in place
    out = torch.ops.eagle_serve.paged_attention(query, key_cache, value_cache, key_slots, visible, 0.2, 16)
    k = key_cache[key_slots].float().transpose(1, 2)  # [N, kv_heads, L, head_dim]
    v = value_cache[key_slots].float().transpose(1, 2)
    expected = F.scaled_dot_product_attention(
        query.transpose(1, 2), k, v, attn_mask=visible[:, None], scale=0.2, enable_gqa=True
    ).transpose(1, 2)  # [N, Q, heads, head_dim]
    assert torch.equal(out[0, 0], torch.zeros(heads, head_dim))
    expected[0, 0] = 0
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_kernel_reads_no_key_past_a_tiles_last_visible_one(dtype):
    """Tiles of one bucket share its key length, the longest context: a shorter tile's keys past
    its own (here NaN, as a freed sequence's stale or never-written slots may be anything) and the
    keys of a padding slot that sees nothing do not reach any output."""
    torch.manual_seed(0)
    heads, kv_heads, head_dim, keys, slots = 9, 3, 64, 50, 200
    key_cache = torch.randn(slots, kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(slots, kv_heads, head_dim).to(dtype)
    key_slots = torch.randperm(slots)[: 3 * keys].view(3, keys)  # [N, L], no slot shared
    lengths = [50, 20, 3]
    visible = torch.zeros(3, 2, keys, dtype=torch.bool)  # [N, Q, L]: slot 1 of each tile is padding
    for n, length in enumerate(lengths):
        visible[n, 0, :length] = True
        key_cache[key_slots[n, length:]] = float("nan")
        value_cache[key_slots[n, length:]] = float("nan")
    query = torch.randn(3, 2, heads, head_dim)
    out = torch.ops.eagle_serve.paged_attention(query, key_cache, value_cache, key_slots, visible, 0.2, 16)
    assert torch.equal(out[:, 1], torch.zeros(3, heads, head_dim))
    for n, length in enumerate(lengths):
        k = key_cache[key_slots[n, :length]].float().transpose(0, 1)  # [kv_heads, length, head_dim]
        v = value_cache[key_slots[n, :length]].float().transpose(0, 1)
        expected = F.scaled_dot_product_attention(
            query[n, :1].transpose(0, 1), k, v, scale=0.2, enable_gqa=True
        ).transpose(0, 1)  # [1, heads, head_dim]
        torch.testing.assert_close(out[n, :1], expected, rtol=1e-5, atol=1e-5)
