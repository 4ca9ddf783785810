"""The block manager's prefix cache on hand-made token sequences: keys, hits, partial blocks,
reference counts and the eviction order."""

from __future__ import annotations

import pytest

from eagle_core.kv import BlockManager, block_hashes

B = 4


def keys(tokens: list[int]) -> list[bytes]:
    return block_hashes(tokens, B)


def computed(manager: BlockManager, tokens: list[int]) -> list[int]:
    """A sequence holding `tokens`, all computed and registered; returns its block table."""
    table: list[int] = []
    manager.grow(table, len(tokens))
    manager.register(table, keys(tokens), 0, len(tokens) // B)
    return table


def test_keys_chain_over_the_whole_prefix_and_skip_a_partial_block():
    a = keys([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(a) == 2  # the ninth token is a partial block: no key
    assert keys([1, 2, 3, 4, 5, 6, 7, 8]) == a
    assert keys([0, 2, 3, 4, 5, 6, 7, 8])[1] != a[1]  # same second block, other first block
    assert block_hashes([5, 6, 7, 8], B, parent=a[0]) == a[1:]  # continuing from a known key


def test_a_new_sequence_shares_the_cached_leading_blocks_and_stops_at_the_first_miss():
    manager = BlockManager(16, B, caching=True)
    first = computed(manager, list(range(12)))
    hits = manager.match(keys([0, 1, 2, 3, 4, 5, 6, 7, 99, 9, 10, 11]))
    assert hits == first[:2]
    table: list[int] = []
    manager.share(table, hits)
    manager.grow(table, 12)
    assert table[:2] == first[:2] and table[2] not in first
    assert manager.num_free_blocks == 16 - 4  # three of the first's blocks and one new one


def test_without_caching_nothing_is_found():
    manager = BlockManager(16, B, caching=False)
    tokens = list(range(12))
    computed(manager, tokens)
    assert manager.match(keys(tokens)) == []
    assert manager.num_cached_blocks == 0


def test_no_block_is_handed_out_while_referenced_and_a_freed_one_stays_findable():
    manager = BlockManager(4, B, caching=True)
    tokens = list(range(8))
    first = computed(manager, tokens)
    second: list[int] = []
    manager.share(second, manager.match(keys(tokens)))
    manager.free(first)  # the second still references both blocks
    other: list[int] = []
    manager.grow(other, 8)  # takes the two never-used blocks
    assert not set(other) & set(second)
    assert not manager.can_grow([], 1)
    held = list(second)
    manager.free(second)  # unreferenced now, but kept with their keys
    assert manager.num_free_blocks == 2
    assert manager.match(keys(tokens)) == held


def test_reusing_a_free_cached_block_takes_it_out_of_the_pool():
    manager = BlockManager(4, B, caching=True)
    tokens = list(range(8))
    first = computed(manager, tokens)
    held = list(first)
    manager.free(first)
    hits = manager.match(keys(tokens))
    assert manager.num_free_after(hits) == 2
    table: list[int] = []
    manager.share(table, hits)
    assert manager.num_free_blocks == 2
    assert table == held


def test_never_keyed_blocks_go_first_then_cached_ones_least_recently_freed_first():
    manager = BlockManager(6, B, caching=True)
    old = computed(manager, list(range(100, 108)))  # blocks o0, o1
    new = computed(manager, list(range(200, 208)))  # blocks n0, n1
    manager.free(list(old))
    manager.free(list(new))
    table: list[int] = []
    manager.grow(table, 2 * B)  # the two never-keyed blocks
    assert not set(table) & set(old + new)
    assert manager.match(keys(list(range(100, 108)))) == old
    manager.grow(table, 3 * B)  # evicts the oldest freed cached block: old's last block
    assert table[-1] == old[1]
    assert manager.match(keys(list(range(100, 108)))) == old[:1]
    manager.grow(table, 4 * B)
    assert table[-1] == old[0]
    assert manager.match(keys(list(range(100, 108)))) == []
    assert manager.match(keys(list(range(200, 208)))) == new


def test_the_same_content_computed_twice_keeps_the_first_block_as_the_hit():
    manager = BlockManager(8, B, caching=True)
    tokens = list(range(8))
    first = computed(manager, tokens)
    twin = computed(manager, tokens)  # computed before it could hit (same step, say)
    assert twin != first
    assert manager.match(keys(tokens)) == first
    manager.free(twin)  # unkeyed: back to the plain free list
    assert manager.num_cached_blocks == 2


def test_share_needs_an_empty_table():
    manager = BlockManager(8, B, caching=True)
    first = computed(manager, list(range(8)))
    with pytest.raises(AssertionError):
        manager.share([first[0]], first)
