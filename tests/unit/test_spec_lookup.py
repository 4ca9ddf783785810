"""Context lookup: the n-gram index's matches, and grafting a lookup chain onto a draft tree."""

from __future__ import annotations

import random

import torch

from eagle_core.spec.lookup import MAX_NGRAM, MIN_NGRAM, ContextLookup, NgramIndex, graft_chain
from eagle_core.spec.tree import DraftTree, select_tree
from tests.unit.test_spec_tree import naive_ancestor_mask


def naive_continuation(tokens: list[int], max_tokens: int) -> list[int]:
    """The longest suffix (MAX_NGRAM..MIN_NGRAM tokens) that occurred earlier, its latest earlier
    occurrence, and what followed it: a plain scan of the whole list."""
    for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
        if len(tokens) <= n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + max_tokens]
    return []


def test_longest_suffix_wins_over_a_later_shorter_match():
    # suffix (1, 2, 3): its 3-gram occurred at 0..2 (followed by 7); the 2-gram (2, 3) also
    # occurred later, at 5..6 (followed by 9): the longer match is the better evidence.
    tokens = [1, 2, 3, 7, 8, 2, 3, 9, 1, 2, 3]
    assert NgramIndex().continuation(tokens, [], 3) == [7, 8, 2]
    assert NgramIndex().continuation(tokens[:4], tokens[4:], 3) == [7, 8, 2]  # prompt + output


def test_latest_occurrence_wins_and_the_suffix_never_matches_itself():
    tokens = [5, 6, 1, 5, 6, 2, 5, 6]
    assert NgramIndex().continuation(tokens, [], 2) == [2, 5]
    assert NgramIndex().continuation([4, 5], [6], 4) == []  # only the suffix itself
    assert NgramIndex().continuation([3], [3, 3], 4) == [3]  # overlapping: (3, 3) ended at 1, then 3


def test_single_token_suffixes_are_not_matched():
    assert MIN_NGRAM == 2
    assert NgramIndex().continuation([8, 1, 9, 8], [], 4) == []


def test_incremental_index_equals_a_fresh_scan():
    rng = random.Random(0)
    prompt = [rng.randrange(6) for _ in range(9)]
    output: list[int] = []
    index = NgramIndex()
    for step in range(400):
        # small vocabulary, sometimes a burst of several tokens (an accepted draft path)
        output += [rng.randrange(6) for _ in range(rng.choice([1, 1, 2, 4]))]
        assert index.continuation(prompt, output, 5) == naive_continuation(prompt + output, 5), step


def test_context_lookup_keeps_one_index_per_request_and_drops_it():
    lookup = ContextLookup(max_tokens=3)
    assert lookup.chain("a", [1, 2, 3, 4], [1, 2]) == [3, 4, 1]
    assert lookup.chain("b", [1], [2]) == []
    assert lookup.chain("a", [1, 2, 3, 4], [1, 2, 3, 4, 9, 3, 4]) == [9, 3, 4]  # latest (3, 4)
    lookup.drop(["a", "missing"])
    assert set(lookup.indexes) == {"b"}


# A head's tree under root 7: node 1 = 10, node 2 = 12 (under 1), node 3 = 11, node 4 = 15 (under 2)
def head_tree():
    tree = select_tree(torch.tensor([7]), torch.tensor([[10, 11, 12, 13, 14, 15]]),
                       torch.tensor([[-1, -1, 0, 0, 1, 2]]),
                       torch.tensor([[-0.1, -1.0, -0.3, -2.0, -1.5, -0.5]]), num_nodes=5)
    assert tree.token_ids[0].tolist() == [7, 10, 11, 12, 15]
    assert tree.parents[0].tolist() == [-1, 0, 0, 1, 3]
    return tree


def check_tree(tree, tokens: list[int], parents: list[int]) -> None:
    assert tree.token_ids[0].tolist() == tokens
    assert tree.parents[0].tolist() == parents
    mask = naive_ancestor_mask(parents)
    assert tree.ancestor_mask[0].tolist() == mask
    assert tree.depths[0].tolist() == [sum(row) - 1 for row in mask]


def graft(tree, chain: list[int], room: int) -> DraftTree:
    """graft_chain on the tree's host lists, rebuilt as the runner does."""
    token_ids, parents = graft_chain(tree.token_ids[0].tolist(), tree.parents[0].tolist(), chain, room)
    return DraftTree.from_parents(torch.tensor([token_ids]), torch.tensor([parents]))


def test_graft_follows_shared_nodes_then_appends_the_rest():
    grafted = graft(head_tree(), [10, 12, 20, 21], room=4)
    check_tree(grafted, [7, 10, 11, 12, 15, 20, 21], [-1, 0, 0, 1, 3, 3, 5])


def test_graft_of_a_new_branch_hangs_from_the_root():
    grafted = graft(head_tree(), [30, 10, 12], room=4)
    check_tree(grafted, [7, 10, 11, 12, 15, 30, 10, 12], [-1, 0, 0, 1, 3, 0, 5, 6])


def test_graft_stops_at_the_room_left():
    grafted = graft(head_tree(), [10, 40, 41, 42], room=2)
    check_tree(grafted, [7, 10, 11, 12, 15, 40, 41], [-1, 0, 0, 1, 3, 1, 5])


def test_graft_of_a_chain_the_tree_already_holds_returns_it_unchanged():
    tokens, parents = [7, 10, 11, 12, 15], [-1, 0, 0, 1, 3]
    assert graft_chain(tokens, parents, [10, 12, 15], room=4) == (tokens, parents)
    assert graft_chain(tokens, parents, [11, 30], room=0) == (tokens, parents)


def test_graft_onto_a_lone_root_is_the_chain():
    assert graft_chain([7], [-1], [30, 31, 32], room=2) == ([7, 30, 31], [-1, 0, 1])
