"""Tree verification: greedy acceptance, lossless sampling, max_new_tokens cuts."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from eagle_core.sampling import sample_from_probs
from eagle_core.spec.tree import DraftTree, ancestor_mask_from_parents
from eagle_core.spec.verify import verify_greedy, verify_sampling


def make_tree(tokens: list[list[int]], parents: list[list[int]]) -> DraftTree:
    parents_t = torch.tensor(parents)
    mask = ancestor_mask_from_parents(parents_t)
    return DraftTree(torch.tensor(tokens), parents_t, mask.sum(-1) - 1, mask)


#   node: 0(root,10)
#         ├── 1 (11) ── 3 (13) ── 5 (15)
#         │         └── 4 (14)
#         └── 2 (12)
TOKENS = [10, 11, 12, 13, 14, 15]
PARENTS = [-1, 0, 0, 1, 1, 3]
TREE = make_tree([TOKENS], [PARENTS])


def argmax_row(**at_node: int) -> list[int]:
    row = [99] * len(TOKENS)  # 99 matches no draft token
    for node, token in at_node.items():
        row[int(node[1:])] = token
    return row


def greedy(rows: list[list[int]], tree: DraftTree = TREE, **kw):
    return verify_greedy(tree, torch.tensor(rows), **kw)


def test_greedy_full_accept():
    v = greedy([argmax_row(n0=11, n1=13, n3=15, n5=42)])
    assert v.accepted_nodes == [[1, 3, 5]]
    assert v.new_token_ids == [[11, 13, 15, 42]]
    assert v.num_accepted == [3]


def test_greedy_partial_accept_other_branch():
    v = greedy([argmax_row(n0=11, n1=14, n4=7)])
    assert v.accepted_nodes == [[1, 4]]
    assert v.new_token_ids == [[11, 14, 7]]
    v = greedy([argmax_row(n0=12, n2=50)])
    assert v.accepted_nodes == [[2]]
    assert v.new_token_ids == [[12, 50]]


def test_greedy_nothing_accepted_bonus_is_argmax_at_root():
    v = greedy([argmax_row(n0=77, n1=13, n3=15)])
    assert v.accepted_nodes == [[]]
    assert v.new_token_ids == [[77]]


def test_greedy_rejected_node_blocks_its_subtree():
    # node 3 would match its parent's argmax, but node 1 is rejected: nothing below it counts
    v = greedy([argmax_row(n0=12, n1=13, n3=15, n2=5)])
    assert v.accepted_nodes == [[2]]
    assert v.new_token_ids == [[12, 5]]


def test_greedy_batch():
    tree = make_tree([TOKENS, TOKENS], [PARENTS, PARENTS])
    v = greedy([argmax_row(n0=11, n1=13, n3=8), argmax_row(n0=3)], tree=tree)
    assert v.accepted_nodes == [[1, 3], []]
    assert v.new_token_ids == [[11, 13, 8], [3]]


def test_greedy_duplicate_siblings_take_the_deepest_then_the_earlier():
    tree = make_tree([[1, 5, 5, 6]], [[-1, 0, 0, 2]])
    v = greedy([[5, 9, 6, 4]], tree=tree)  # both 5s match; only node 2 has a matching child
    assert v.accepted_nodes == [[2, 3]]
    assert v.new_token_ids == [[5, 6, 4]]
    v = greedy([[5, 9, 7, 4]], tree=tree)  # equally deep: node 1 comes first
    assert v.accepted_nodes == [[1]]
    assert v.new_token_ids == [[5, 9]]


@pytest.mark.parametrize(
    ("limit", "nodes", "tokens"),
    [
        (1, [], [11]),
        (2, [1], [11, 13]),
        (3, [1, 3], [11, 13, 15]),
        (4, [1, 3, 5], [11, 13, 15, 42]),
    ],
)
def test_greedy_max_new_tokens_cut(limit, nodes, tokens):
    v = greedy([argmax_row(n0=11, n1=13, n3=15, n5=42)], max_new_tokens=[limit])
    assert v.accepted_nodes == [nodes]
    assert v.new_token_ids == [tokens]
    assert len(v.new_token_ids[0]) == len(v.accepted_nodes[0]) + 1


def test_limits_are_validated():
    with pytest.raises(ValueError):
        greedy([argmax_row()], max_new_tokens=[0])
    with pytest.raises(ValueError):
        greedy([argmax_row()], max_new_tokens=[1, 2])
    with pytest.raises(ValueError):
        verify_sampling(TREE, torch.full((1, 6, 100), 0.01), keys=[], num_output=[])


# ---------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------


def one_hot_probs(argmax: list[list[int]], vocab: int = 100) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(argmax), vocab).float()


def test_sampling_with_one_hot_target_equals_greedy():
    rows = [
        argmax_row(n0=11, n1=13, n3=15, n5=42),
        argmax_row(n0=12, n2=50),
        argmax_row(n0=77),
        argmax_row(n0=11, n1=14, n4=7),
    ]
    tree = make_tree([TOKENS] * 4, [PARENTS] * 4)
    keys, num_output = [0, 1, 2, 3], [0, 5, 9, 2]
    sampled = verify_sampling(tree, one_hot_probs(rows), keys, num_output)
    expected = greedy(rows, tree=tree)
    assert sampled == expected
    cut = verify_sampling(tree, one_hot_probs(rows), keys, num_output, max_new_tokens=[2, 2, 2, 1])
    assert cut == greedy(rows, tree=tree, max_new_tokens=[2, 2, 2, 1])


def test_sampling_is_reproducible_and_batch_independent():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 6, 20, generator=gen) * 3, -1)
    tree = make_tree([[0, 1, 2, 3, 4, 5]] * 3, [PARENTS] * 3)
    together = verify_sampling(tree, probs, [1, 2, 3], [4, 7, 0])
    alone = verify_sampling(make_tree([[0, 1, 2, 3, 4, 5]], [PARENTS]), probs[1:2], [2], [7])
    assert together.new_token_ids[1] == alone.new_token_ids[0]
    assert together.accepted_nodes[1] == alone.accepted_nodes[0]


# Tiny vocabulary for the statistical checks. Root's children carry tokens 1 and 3; node 1
# (token 1) has a child with token 2.
VOCAB = 6
STAT_TREE = make_tree([[0, 1, 3, 2]], [[-1, 0, 0, 1]])
P_ROOT = torch.tensor([0.10, 0.30, 0.05, 0.25, 0.20, 0.10])
P_NODE1 = torch.tensor([0.05, 0.15, 0.40, 0.10, 0.20, 0.10])
P_OTHER = torch.full((VOCAB,), 1.0 / VOCAB)
NUM_TRIALS = 20_000


def stat_probs(num: int) -> torch.Tensor:
    probs = torch.stack([P_ROOT, P_NODE1, P_OTHER, P_OTHER])  # [N, V]
    return probs.expand(num, -1, -1)


def chi_square_pvalue(samples: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=len(probs)).double()
    expected = probs.double() / probs.double().sum() * len(samples)
    return float(stats.chisquare(counts.numpy(), expected.numpy()).pvalue)


def run_stat_verification():
    tree = DraftTree(
        STAT_TREE.token_ids.expand(NUM_TRIALS, -1),
        STAT_TREE.parents.expand(NUM_TRIALS, -1),
        STAT_TREE.depths.expand(NUM_TRIALS, -1),
        STAT_TREE.ancestor_mask.expand(NUM_TRIALS, -1, -1),
    )
    # one request key per trial
    return verify_sampling(tree, stat_probs(NUM_TRIALS), list(range(1234, 1234 + NUM_TRIALS)), [0] * NUM_TRIALS)


def biased_first_tokens() -> list[int]:
    """The classic mistake: accept a draft child x with probability p(x), and on rejection
    sample again from the full p instead of the residual. Over-produces draft tokens."""
    gen = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(NUM_TRIALS):
        first_child_token = 1
        if torch.rand(1, generator=gen).item() < P_ROOT[first_child_token]:
            out.append(first_child_token)
        else:
            out.append(sample_from_probs(P_ROOT, 1234, len(out)))
    return out


def test_sampling_first_token_follows_target_distribution():
    v = run_stat_verification()
    first = [tokens[0] for tokens in v.new_token_ids]
    assert chi_square_pvalue(first, P_ROOT) > 1e-3
    # the test has power: the biased variant fails the same check
    assert chi_square_pvalue(biased_first_tokens(), P_ROOT) < 1e-6


def test_sampling_second_token_follows_target_at_accepted_node():
    v = run_stat_verification()
    after_node1 = [
        t[1] for t, nodes in zip(v.new_token_ids, v.accepted_nodes, strict=True) if nodes[:1] == [1]
    ]
    assert len(after_node1) > 0.25 * NUM_TRIALS
    assert chi_square_pvalue(after_node1, P_NODE1) > 1e-3
    # acceptance bookkeeping: the first token is accepted iff it is a child's token
    for tokens, nodes in zip(v.new_token_ids, v.accepted_nodes, strict=True):
        assert len(tokens) == len(nodes) + 1
        assert (tokens[0] in (1, 3)) == (len(nodes) > 0)


def test_sampling_cut_to_one_token_still_follows_target():
    num = 5_000
    tree = DraftTree(
        STAT_TREE.token_ids.expand(num, -1),
        STAT_TREE.parents.expand(num, -1),
        STAT_TREE.depths.expand(num, -1),
        STAT_TREE.ancestor_mask.expand(num, -1, -1),
    )
    v = verify_sampling(tree, stat_probs(num), list(range(7, 7 + num)), [3] * num, max_new_tokens=[1] * num)
    assert all(len(t) == 1 for t in v.new_token_ids)
    assert all(nodes == [] for nodes in v.accepted_nodes)
    assert chi_square_pvalue([t[0] for t in v.new_token_ids], P_ROOT) > 1e-3
