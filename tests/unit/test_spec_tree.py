"""Draft trees: frontier expansion, global top-N selection, parents/depths/masks/paths."""

from __future__ import annotations

import math

import pytest
import torch

from eagle_core.spec.tree import (
    CandidatePool,
    ancestor_mask_from_parents,
    expand_frontier,
    select_tree,
)


def naive_ancestor_mask(parents: list[int]) -> list[list[bool]]:
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            mask[i][j] = True
            j = parents[j]
    return mask


def lp(*probs: float) -> list[float]:
    return [math.log(p) if p > 0 else float("-inf") for p in probs]


# ---------------------------------------------------------------------------------------------
# select_tree on hand-made candidates
# ---------------------------------------------------------------------------------------------

# candidates (parents first):      score
#   c0 tok 10  parent root          -0.1
#   c1 tok 11  parent root          -1.0
#   c2 tok 12  parent c0            -0.3
#   c3 tok 13  parent c0            -2.0
#   c4 tok 14  parent c1            -1.5
#   c5 tok 15  parent c2            -0.5
CAND_TOKENS = [10, 11, 12, 13, 14, 15]
CAND_PARENT = [-1, -1, 0, 0, 1, 2]
CAND_SCORES = [-0.1, -1.0, -0.3, -2.0, -1.5, -0.5]


def hand_tree(num_nodes: int):
    return select_tree(
        torch.tensor([7]),
        torch.tensor([CAND_TOKENS]),
        torch.tensor([CAND_PARENT]),
        torch.tensor([CAND_SCORES]),
        num_nodes,
    )


def test_select_keeps_best_and_orders_by_candidate_index():
    tree = hand_tree(num_nodes=5)  # best 4: c0 (-0.1), c2 (-0.3), c5 (-0.5), c1 (-1.0)
    assert tree.token_ids.tolist() == [[7, 10, 11, 12, 15]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 3]]
    assert tree.depths.tolist() == [[0, 1, 1, 2, 3]]
    assert tree.ancestor_mask[0].tolist() == naive_ancestor_mask([-1, 0, 0, 1, 3])
    assert tree.num_nodes == 5 and tree.batch_size == 1


def test_ranks_are_the_score_order_so_the_best_n_nodes_are_those_of_rank_below_n():
    tree = hand_tree(num_nodes=5)  # nodes 10, 11, 12, 15 ranked by score 1, 4, 2, 3
    assert tree.ranks.tolist() == [[0, 1, 4, 2, 3]]
    for n in range(1, 5):
        smaller = hand_tree(num_nodes=n)
        kept = [t for t, r in zip(tree.token_ids[0].tolist(), tree.ranks[0].tolist()) if r < n]
        assert smaller.token_ids[0].tolist() == kept


def test_paths_children_leaves_positions():
    tree = hand_tree(num_nodes=5)
    assert tree.children(0) == [[1, 2], [3], [], [4], []]
    assert tree.paths(0) == [[0, 2], [0, 1, 3, 4]]
    assert tree.is_leaf().tolist() == [[False, False, True, False, True]]
    assert tree.positions(torch.tensor([100])).tolist() == [[100, 101, 101, 102, 103]]


def test_ancestor_mask_rows_are_parent_row_plus_self():
    tree = hand_tree(num_nodes=7)
    mask, parents = tree.ancestor_mask[0], tree.parents[0]
    for i in range(1, tree.num_nodes):
        expected = mask[parents[i]].clone()
        expected[i] = True
        assert torch.equal(mask[i], expected)
    assert torch.equal(tree.depths[0], mask.sum(-1) - 1)


def test_more_nodes_than_candidates_keeps_all():
    tree = hand_tree(num_nodes=50)
    assert tree.num_nodes == len(CAND_TOKENS) + 1
    assert tree.token_ids[0, 1:].tolist() == CAND_TOKENS


def test_root_only():
    tree = hand_tree(num_nodes=1)
    assert tree.token_ids.tolist() == [[7]]
    assert tree.parents.tolist() == [[-1]]
    assert tree.ancestor_mask.tolist() == [[[True]]]
    assert tree.paths(0) == [[0]]


def test_ties_go_to_the_earlier_candidate_which_keeps_parents():
    # c1 is c0's child with log-prob 0: both score -0.5, as does the later sibling c2.
    tree = select_tree(
        torch.tensor([1]),
        torch.tensor([[20, 21, 22]]),
        torch.tensor([[-1, 0, -1]]),
        torch.tensor([[-0.5, -0.5, -0.5]]),
        num_nodes=3,
    )
    assert tree.token_ids.tolist() == [[1, 20, 21]]
    assert tree.parents.tolist() == [[-1, 0, 1]]
    tree = select_tree(
        torch.tensor([1]),
        torch.tensor([[20, 21, 22]]),
        torch.tensor([[-1, 0, -1]]),
        torch.tensor([[-0.5, -0.5, -0.5]]),
        num_nodes=2,
    )
    assert tree.token_ids.tolist() == [[1, 20]]


def test_child_outscoring_parent_is_rejected():
    with pytest.raises(ValueError, match="parent was dropped"):
        select_tree(
            torch.tensor([1]),
            torch.tensor([[20, 21, 22]]),
            torch.tensor([[-1, -1, 0]]),
            torch.tensor([[-3.0, -1.0, -0.5]]),
            num_nodes=3,
        )


def test_batch_rows_are_independent():
    tokens = torch.tensor([CAND_TOKENS, CAND_TOKENS])
    parents = torch.tensor([CAND_PARENT, CAND_PARENT])
    scores = torch.tensor([CAND_SCORES, [-5.0, -0.2, -6.0, -7.0, -0.4, -8.0]])
    tree = select_tree(torch.tensor([7, 8]), tokens, parents, scores, num_nodes=3)
    assert tree.token_ids.tolist() == [[7, 10, 12], [8, 11, 14]]
    assert tree.parents.tolist() == [[-1, 0, 1], [-1, 0, 1]]
    assert tree.depths.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_ancestor_mask_matches_naive_on_random_trees():
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 8, 33, 64):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        got = ancestor_mask_from_parents(torch.tensor([parents]))
        assert got[0].tolist() == naive_ancestor_mask(parents)
    chain = [-1] + list(range(63))
    assert ancestor_mask_from_parents(torch.tensor([chain]))[0].tolist() == naive_ancestor_mask(
        chain
    )


# ---------------------------------------------------------------------------------------------
# expand_frontier and the candidate pool
# ---------------------------------------------------------------------------------------------


def test_expand_frontier_scores_and_new_frontier():
    frontier_scores = torch.tensor([[-0.2, -1.0]])
    child_logprobs = torch.tensor([[lp(0.1, 0.6, 0.3, 0.0), lp(0.5, 0.1, 0.1, 0.3)]])
    e = expand_frontier(frontier_scores, child_logprobs, top_k=2)
    assert e.cand_token_ids.tolist() == [[1, 2, 0, 3]]
    assert e.cand_frontier_idx.tolist() == [[0, 0, 1, 1]]
    expected = [
        -0.2 + math.log(0.6),
        -0.2 + math.log(0.3),
        -1.0 + math.log(0.5),
        -1.0 + math.log(0.3),
    ]
    assert e.cand_scores[0].tolist() == pytest.approx(expected)
    assert e.new_frontier_idx.tolist() == [[0, 1]]  # -0.71, -1.40 beat -1.69, -2.20
    assert e.frontier_token_ids().tolist() == [[1, 2]]
    assert e.frontier_parent_idx().tolist() == [[0, 0]]
    assert e.frontier_scores()[0].tolist() == pytest.approx(expected[:2])


def test_expand_frontier_from_root_and_width():
    e = expand_frontier(torch.zeros(1, 1), torch.tensor([[lp(0.1, 0.2, 0.3, 0.4)]]), top_k=3)
    assert e.cand_token_ids.tolist() == [[3, 2, 1]]
    assert e.new_frontier_idx.tolist() == [[0, 1, 2]]
    e = expand_frontier(
        torch.zeros(1, 1), torch.tensor([[lp(0.1, 0.2, 0.3, 0.4)]]), 3, num_frontier=1
    )
    assert e.new_frontier_idx.tolist() == [[0]]
    with pytest.raises(ValueError):
        expand_frontier(torch.zeros(1, 1), torch.zeros(1, 1, 4), top_k=5)


def test_expand_frontier_ties_are_stable():
    child_logprobs = torch.log(torch.full((1, 2, 4), 0.25))
    e = expand_frontier(torch.zeros(1, 2), child_logprobs, top_k=2)
    assert e.new_frontier_idx.tolist() == [[0, 1]]


def draft(batch: int, depth: int, top_k: int, vocab: int, num_nodes: int, seed: int = 0):
    """A drafting loop as the worker runs it, with random log-probs instead of a head."""
    gen = torch.Generator().manual_seed(seed)
    pool = CandidatePool()
    scores = torch.zeros(batch, 1)
    logprobs = torch.log_softmax(torch.randn(batch, 1, vocab, generator=gen), -1)
    for _ in range(depth):
        e = expand_frontier(scores, logprobs, top_k)
        pool.add(e)
        scores = e.frontier_scores()
        logprobs = torch.log_softmax(torch.randn(batch, scores.shape[1], vocab, generator=gen), -1)
    return pool, pool.select(torch.arange(batch), num_nodes)


def test_chain_when_top_k_is_one():
    _, tree = draft(batch=3, depth=5, top_k=1, vocab=50, num_nodes=100)
    assert tree.num_nodes == 6
    assert tree.parents.tolist() == [[-1, 0, 1, 2, 3, 4]] * 3
    assert tree.depths.tolist() == [[0, 1, 2, 3, 4, 5]] * 3
    assert torch.equal(tree.ancestor_mask, torch.ones(6, 6).tril().bool().expand(3, 6, 6))
    assert tree.paths(1) == [[0, 1, 2, 3, 4, 5]]


def test_drafted_tree_is_consistent():
    pool, tree = draft(batch=4, depth=5, top_k=4, vocab=100, num_nodes=16)
    assert pool.num_candidates == 4 + 4 * 16
    assert tree.token_ids.shape == (4, 16)
    for b in range(4):
        parents = tree.parents[b].tolist()
        assert all(p < i for i, p in enumerate(parents))
        assert tree.ancestor_mask[b].tolist() == naive_ancestor_mask(parents)
        assert tree.depths[b].max() <= 5


def test_frontier_lineage_points_at_ancestors():
    # level 1 frontier: root's children; level 2: their children; lineage of a level-3 frontier
    # node gives its ancestors' positions in the level-1 and level-2 frontiers.
    pool = CandidatePool()
    e1 = expand_frontier(torch.zeros(1, 1), torch.tensor([[lp(0.6, 0.4, 0.0)]]), top_k=2)
    pool.add(e1)  # frontier: tok0 (f0), tok1 (f1)
    assert pool.frontier_lineage.shape == (1, 2, 0)
    e2 = expand_frontier(
        e1.frontier_scores(), torch.tensor([[lp(0.15, 0.05, 0.8), lp(0.9, 0.07, 0.03)]]), 2
    )
    pool.add(e2)  # f0->tok2 .48, f0->tok0 .09, f1->tok0 .36, f1->tok1 .028: frontier .48, .36
    assert e2.frontier_token_ids().tolist() == [[2, 0]]
    assert pool.frontier_lineage.tolist() == [[[0], [1]]]
    e3 = expand_frontier(
        e2.frontier_scores(), torch.tensor([[lp(0.7, 0.2, 0.1), lp(0.7, 0.2, 0.1)]]), 2
    )
    pool.add(e3)  # .336, .096, .252, .072: frontier = tok0 under each level-2 frontier node
    assert pool.frontier_lineage.tolist() == [[[0, 0], [1, 1]]]
    tree = pool.select(torch.tensor([9]), num_nodes=7)
    # best six of .6 .4 | .48 .09 .36 .028 | .336 .096 .252 .072, in candidate order
    assert tree.token_ids.tolist() == [[9, 0, 1, 2, 0, 0, 0]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2, 3, 4]]
