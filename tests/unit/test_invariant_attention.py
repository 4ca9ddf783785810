"""The pieces of --deterministic: the invariant attention backend and block linears give a token
the same bits whatever else the forward computes (tests/integration/test_deterministic.py runs
the engine)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle_core.worker.attn_invariant import (
    CHUNK,
    InvariantBackend,
    token_attention,
    visible_positions,
)
from eagle_core.worker.inputs import SeqGroup, causal_group
from eagle_core.worker.invariant_linear import BLOCK_ROWS, BlockLinear

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 16, 4
CONTEXT = 10
"""Committed positions of sequence A (blocks 0-2); its new tokens follow."""


def storage(seed: int = 0) -> torch.Tensor:
    """[1 layer, 2, 128 slots + trash, kv_heads, head_dim] with random committed K/V."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, 129, KV_HEADS, DIM, generator=generator)


def attend(kv: torch.Tensor, groups: list[SeqGroup], q, k, v) -> torch.Tensor:
    """[T, heads, d] outputs of one layer over `groups` (q [T, heads, d], k and v [T, kv, d])."""
    meta = InvariantBackend(BLOCK, torch.device("cpu"), 128).prepare(groups).meta
    out = meta.attend(0, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], kv, None)
    return out[0]


def rand(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_a_decode_token_gets_the_same_bits_alone_and_beside_a_longer_sequence():
    q, k, v = rand(2, HEADS, DIM, seed=1), rand(2, KV_HEADS, DIM, seed=2), rand(2, KV_HEADS, DIM, seed=3)
    kv = storage()
    alone = attend(kv, [causal_group([[5]], [CONTEXT], [[0, 1, 2]], BLOCK)], q[:1], k[:1], v[:1])
    # B (positions 0-99, blocks 3-27) makes the forward's key lists longer than one chunk; A's is one
    assert 100 > CHUNK > CONTEXT + 1
    batched = attend(storage(), [causal_group([[5], [6]], [CONTEXT, 99], [[0, 1, 2], list(range(3, 28))], BLOCK)], q, k, v)
    assert torch.equal(batched[0], alone[0])
    keys, values = (_keys(kv, i, [0, 1, 2], CONTEXT + 1).repeat_interleave(HEADS // KV_HEADS, 0) for i in (0, 1))
    reference = F.scaled_dot_product_attention(q[:1].transpose(0, 1)[None], keys[None], values[None])  # [1, heads, 1, d]
    assert torch.allclose(alone[0], reference[0, :, 0], atol=1e-5)


def test_a_token_gets_the_same_bits_alone_and_in_a_tile_of_others():
    """SmolLM2's attention shapes (9 query heads over 3 KV heads, 64 wide), a bf16 cache: one
    token's output alone, beside 1, 3 or 15 other tokens, and with the tile's key lists one chunk
    longer than its own. (torch.bmm failed this on the AMD EPYC VM.)"""
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(300, 3, 64, generator=generator).to(torch.bfloat16)
    values = torch.randn(300, 3, 64, generator=generator).to(torch.bfloat16)
    q = torch.randn(16, 9, 64, generator=generator).to(torch.bfloat16)
    slots = torch.randint(0, 300, (16, 2 * CHUNK), generator=generator)
    count = torch.randint(1, 2 * CHUNK + 1, (16,), generator=generator)
    count[0] = CHUNK - 13
    alone = token_attention(q[:1], keys, values, slots[:1, :CHUNK], count[:1], None)[0]
    for tile in (2, 4, 16):
        for length in (CHUNK, 2 * CHUNK):
            counts = count[:tile].clamp(max=length)
            out = token_attention(q[:tile], keys, values, slots[:tile, :length], counts, None)
            assert torch.equal(out[0], alone), (tile, length)


def _keys(kv: torch.Tensor, which: int, table: list[int], length: int) -> torch.Tensor:
    """[kv_heads, length, d]: positions 0 .. length - 1 of a sequence with block table `table`."""
    slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(length)])
    return kv[0, which][slots].transpose(0, 1)


def test_a_tree_node_gets_the_bits_of_the_same_token_decoded_plainly():
    """Tree: root (node 0), nodes 1 and 2 its children, node 3 the child of node 2. Node 3 sees
    the context, root, node 2, itself: plain decoding of root, node 2, node 3 as three causal
    tokens computes the same rows."""
    q, k, v = rand(4, HEADS, DIM, seed=4), rand(4, KV_HEADS, DIM, seed=5), rand(4, KV_HEADS, DIM, seed=6)
    ancestors = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    tree = SeqGroup(
        token_ids=torch.tensor([[5, 6, 7, 8]]), start_pos=torch.tensor([CONTEXT]),
        block_tables=torch.tensor([[0, 1, 2, 3]]), key_len=CONTEXT + 4,
        positions=torch.tensor([[CONTEXT, CONTEXT + 1, CONTEXT + 1, CONTEXT + 2]]),
        committed_len=torch.tensor([CONTEXT]), tail_mask=ancestors[None],
    )
    positions, count = visible_positions(tree)
    assert count.tolist() == [CONTEXT + 1, CONTEXT + 2, CONTEXT + 2, CONTEXT + 3]
    assert positions[3, : CONTEXT + 3].tolist() == [*range(CONTEXT), CONTEXT, CONTEXT + 2, CONTEXT + 3]
    in_tree = attend(storage(), [tree], q, k, v)
    path = [0, 2, 3]
    plain = attend(storage(), [causal_group([[5, 7, 8]], [CONTEXT], [[0, 1, 2, 3]], BLOCK)], q[path], k[path], v[path])
    assert torch.equal(in_tree[path], plain)


def test_a_block_linear_row_does_not_depend_on_the_other_rows():
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        linear = torch.nn.Linear(576, 4096, bias=False).to(dtype)
        block = BlockLinear(linear)
        assert block.is_invariant()
        x = torch.randn(3 * BLOCK_ROWS + 3, 576, generator=generator).to(dtype)  # [27, 576]
        together = block(x)
        for row in (0, BLOCK_ROWS + 1, 3 * BLOCK_ROWS + 2):
            assert torch.equal(block(x[row : row + 1])[0], together[row])
        assert torch.allclose(together.float(), linear(x).float(), rtol=2e-2, atol=2e-2)
