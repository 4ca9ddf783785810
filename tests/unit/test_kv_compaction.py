"""Keeping an accepted path's KV: slot moves and the storage copy."""

from __future__ import annotations

import torch

from eagle_core.worker.kv_storage import KVStorage
from eagle_core.worker.spec_runner import accepted_path_moves


def test_moves_make_the_accepted_path_contiguous_across_blocks():
    # blocks of 4; the sequence owns blocks 7 and 2 (positions 0-3 -> block 7, 4-7 -> block 2)
    table, block = [7, 2], 4
    src, dst = accepted_path_moves(table, start=2, accepted=[1, 3, 5], block_size=block)
    # node 1 is already at position 3; node 3 (pos 5) -> pos 4; node 5 (pos 7) -> pos 5
    assert src == [2 * 4 + 1, 2 * 4 + 3]
    assert dst == [2 * 4 + 0, 2 * 4 + 1]


def test_nothing_moves_for_a_chain_prefix_or_no_acceptance():
    assert accepted_path_moves([0], start=0, accepted=[1, 2, 3], block_size=16) == ([], [])
    assert accepted_path_moves([0], start=5, accepted=[], block_size=16) == ([], [])


def test_storage_move_copies_every_layer_and_handles_overlap():
    kv = KVStorage(num_layers=3, num_slots=16, num_kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"))
    kv.kv.copy_(torch.arange(kv.kv.numel(), dtype=torch.float32).view_as(kv.kv))
    before = kv.kv.clone()
    # chained moves: 3 -> 2 and 5 -> 3 (slot 3 is both a source and a destination)
    kv.move(torch.tensor([3, 5]), torch.tensor([2, 3]))
    assert torch.equal(kv.kv[:, :, 2], before[:, :, 3])
    assert torch.equal(kv.kv[:, :, 3], before[:, :, 5])
    untouched = [s for s in range(16) if s not in (2, 3)]
    assert torch.equal(kv.kv[:, :, untouched], before[:, :, untouched])
