"""EAGLE-2 dynamic draft trees: expand a frontier level by level, keep the globally best nodes.

Drafting one step for a batch of B sequences (V = the draft head's vocabulary):

    pool = CandidatePool()
    frontier_scores = zeros(B, 1)                        # the root, score 0
    logprobs = log_softmax(head logits at the root)      # [B, 1, V]
    for level in range(depth):
        expansion = expand_frontier(frontier_scores, logprobs, top_k)
        pool.add(expansion)
        if level == depth - 1: break
        tokens = expansion.frontier_token_ids()          # [B, K] next draft-forward inputs
        frontier_scores = expansion.frontier_scores()    # [B, K]
        logprobs = log_softmax(head logits at tokens)    # [B, K, V]
    tree = pool.select(root_token_ids, num_nodes)

A node's score is the cumulative draft log-probability of its path. Because a child's score is
its parent's plus a log-probability (<= 0), a child never outscores its parent; candidates are
numbered parents-first, so keeping the best `num_nodes - 1` with ties broken towards the earlier
candidate always keeps a tree. `top_k = 1` gives a chain.

Token ids out of `expand_frontier` are whatever the head's logits index: draft ids for an
EAGLE-3 head with a reduced vocabulary. Map them to target ids before adding the level, e.g.
`expansion._replace(cand_token_ids=head.draft_to_target(expansion.cand_token_ids))`: the next
draft forward embeds target ids, and verification compares target ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass
class DraftTree:
    """A batch of draft trees, all with N nodes.

    Node 0 is the root: the last sampled token, whose KV is not yet computed; it is verified
    together with the drafts. Nodes are ordered so that every parent precedes its children, so a
    root-to-leaf path has increasing node indices.
    """

    token_ids: torch.Tensor  # [B, N] long
    parents: torch.Tensor  # [B, N] long, parent node index, -1 for the root
    depths: torch.Tensor  # [B, N] long, root depth 0
    ancestor_mask: torch.Tensor  # [B, N, N] bool, [b, i, j] iff j == i or j is an ancestor of i
    ranks: torch.Tensor | None = None
    """[B, N] long: each node's place in its drafting step's score order (the root 0, the best
    candidate 1, ...), so the tree of the best n nodes is the nodes of rank < n; 0 also for
    nodes added beside the head's (a context-lookup chain), which a smaller head tree would
    keep too. None where unknown (a tree rebuilt by a grammar)."""

    @classmethod
    def from_parents(cls, token_ids: torch.Tensor, parents: torch.Tensor, ranks: torch.Tensor | None = None) -> DraftTree:
        """A tree from its tokens and parent indices ([B, N] each, parents first); depths and
        the ancestor mask follow from the parents."""
        ancestor_mask = ancestor_mask_from_parents(parents)  # [B, N, N]
        return cls(token_ids, parents, ancestor_mask.sum(dim=-1) - 1, ancestor_mask, ranks)

    @property
    def batch_size(self) -> int:
        return self.token_ids.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.token_ids.shape[1]

    def positions(self, start_pos: torch.Tensor) -> torch.Tensor:
        """Position ids of the nodes: `start_pos` ([B], the root's position) plus depth. [B, N]"""
        return start_pos.to(self.depths.device)[:, None] + self.depths

    def is_leaf(self) -> torch.Tensor:
        """[B, N] bool: True for nodes without children."""
        has_child = torch.zeros_like(self.token_ids, dtype=torch.bool)
        parents = self.parents.clamp(min=0)
        has_child.scatter_(1, parents, self.parents >= 0)
        return ~has_child

    def children(self, b: int) -> list[list[int]]:
        """Children of every node of sequence `b`, in node order."""
        out: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for node, parent in enumerate(self.parents[b].tolist()):
            if parent >= 0:
                out[parent].append(node)
        return out

    def paths(self, b: int) -> list[list[int]]:
        """Root-to-leaf node paths of sequence `b`, one per leaf, leaves in node order."""
        parents = self.parents[b].tolist()
        leaves = self.is_leaf()[b].tolist()
        paths = []
        for node, leaf in enumerate(leaves):
            if not leaf:
                continue
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            paths.append(path[::-1])
        return paths


class Expansion(NamedTuple):
    """One level of candidates: the top_k children of each of K frontier nodes (C = K * top_k)."""

    cand_token_ids: torch.Tensor  # [B, C] long, candidate k * top_k + j is child j of frontier k
    cand_frontier_idx: torch.Tensor  # [B, C] long, the frontier node (0..K-1) each extends
    cand_scores: torch.Tensor  # [B, C] float, frontier score + child log-probability
    new_frontier_idx: (
        torch.Tensor
    )  # [B, F] long, candidate indices of the next frontier, best first

    def frontier_token_ids(self) -> torch.Tensor:
        """Tokens of the next frontier (inputs of the next draft forward). [B, F]"""
        return self.cand_token_ids.gather(1, self.new_frontier_idx)

    def frontier_scores(self) -> torch.Tensor:
        """Scores of the next frontier. [B, F]"""
        return self.cand_scores.gather(1, self.new_frontier_idx)

    def frontier_parent_idx(self) -> torch.Tensor:
        """For each next-frontier node, the current frontier node (0..K-1) it extends. [B, F]"""
        return self.cand_frontier_idx.gather(1, self.new_frontier_idx)


def expand_frontier(
    frontier_scores: torch.Tensor,  # [B, K]
    child_logprobs: torch.Tensor,  # [B, K, V]
    top_k: int,
    num_frontier: int | None = None,
) -> Expansion:
    """Expand each frontier node into its `top_k` most likely children (EAGLE-2); see
    `expand_top`, which takes the children already chosen."""
    vocab = child_logprobs.shape[2]
    if not 1 <= top_k <= vocab:
        raise ValueError(f"top_k must be in [1, {vocab}], got {top_k}")
    top = torch.topk(child_logprobs, top_k, dim=-1)  # values/indices [B, K, top_k]
    return expand_top(frontier_scores, top.values, top.indices, top_k, num_frontier)


def expand_top(
    frontier_scores: torch.Tensor,  # [B, K]
    top_logprobs: torch.Tensor,  # [B, K, top_k] each frontier node's best children, best first
    top_ids: torch.Tensor,  # [B, K, top_k] their token ids
    top_k: int,
    num_frontier: int | None = None,
) -> Expansion:
    """Candidates from each frontier node's `top_k` best children.

    A candidate's score is its frontier node's score plus its own log-probability. The next
    frontier is the best `num_frontier` (default `top_k`, at most K * top_k) candidates; ties go
    to the earlier candidate, so the result is deterministic.
    """
    batch, num_nodes, _ = top_logprobs.shape
    cand_scores = (frontier_scores[:, :, None] + top_logprobs).reshape(batch, num_nodes * top_k)
    cand_token_ids = top_ids.reshape(batch, num_nodes * top_k)
    cand_frontier_idx = (
        torch.arange(num_nodes, device=top_logprobs.device)
        .repeat_interleave(top_k)
        .expand(batch, num_nodes * top_k)
    )
    width = min(num_frontier or top_k, num_nodes * top_k)
    order = torch.sort(cand_scores, dim=1, descending=True, stable=True).indices
    return Expansion(cand_token_ids, cand_frontier_idx, cand_scores, order[:, :width])


class CandidatePool:
    """All candidates of one drafting step, numbered globally level after level (parents first).

    Also tracks, for the current frontier, its lineage: for each frontier node and each earlier
    drafted level, which node of that level's frontier is its ancestor. That is what a draft
    forward's attention mask needs when frontier nodes of every level sit in the draft KV.
    """

    def __init__(self) -> None:
        self._token_ids: list[torch.Tensor] = []
        self._parents: list[torch.Tensor] = []
        self._scores: list[torch.Tensor] = []
        self._size = 0
        self._frontier_ids: torch.Tensor | None = None  # [B, F] global ids; None = the root
        self.frontier_lineage: torch.Tensor | None = None
        """[B, F, L] long: frontier index at each of the L earlier frontiers; None before add()."""

    @property
    def num_candidates(self) -> int:
        return self._size

    def add(self, expansion: Expansion) -> None:
        """Add one level; `expansion` must extend the frontier of the previous `add` (or the root)."""
        token_ids, frontier_idx, scores, new_frontier = expansion
        batch, width = new_frontier.shape
        if self._frontier_ids is None:
            parents = torch.full_like(token_ids, -1)
            self.frontier_lineage = torch.zeros(
                batch, width, 0, dtype=torch.long, device=token_ids.device
            )
        else:
            assert self.frontier_lineage is not None
            parents = self._frontier_ids.gather(1, frontier_idx)
            parent_idx = expansion.frontier_parent_idx()  # [B, F]
            inherited = self.frontier_lineage.gather(
                1, parent_idx[:, :, None].expand(-1, -1, self.frontier_lineage.shape[2])
            )
            self.frontier_lineage = torch.cat([inherited, parent_idx[:, :, None]], dim=2)
        self._token_ids.append(token_ids)
        self._parents.append(parents)
        self._scores.append(scores)
        self._frontier_ids = self._size + new_frontier
        self._size += token_ids.shape[1]

    def select(self, root_token_ids: torch.Tensor, num_nodes: int) -> DraftTree:
        """The tree of the best `num_nodes - 1` candidates under `root_token_ids` ([B])."""
        return select_tree(
            root_token_ids,
            torch.cat(self._token_ids, dim=1),
            torch.cat(self._parents, dim=1),
            torch.cat(self._scores, dim=1),
            num_nodes,
        )


def select_tree(
    root_token_ids: torch.Tensor,  # [B]
    cand_token_ids: torch.Tensor,  # [B, C]
    cand_parent: torch.Tensor,  # [B, C] index of the parent candidate, -1 = child of the root
    cand_scores: torch.Tensor,  # [B, C]
    num_nodes: int,
) -> DraftTree:
    """Keep the best `num_nodes - 1` candidates (ties: earlier wins) under a root; build the tree,
    with each node's rank in score order (DraftTree.ranks).

    Candidates must be numbered parents-first and a child's score must not exceed its parent's
    (both hold for `expand_frontier` levels added in order). The tree has min(num_nodes, C + 1)
    nodes; kept candidates appear in candidate order, so parents precede children.
    Raises ValueError if a kept candidate's parent was not kept (the ordering contract was broken).
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    batch, num_cands = cand_scores.shape
    device = cand_scores.device
    num_kept = min(num_nodes - 1, num_cands)
    best = torch.sort(cand_scores, dim=1, descending=True, stable=True).indices[:, :num_kept]
    kept = best.sort(dim=1).values  # [B, M] candidate indices in candidate order
    rank_of_cand = torch.zeros((batch, num_cands), dtype=torch.long, device=device)
    rank_of_cand.scatter_(1, best, torch.arange(1, num_kept + 1, device=device).expand(batch, num_kept))

    node_of_cand = torch.full((batch, num_cands), -1, dtype=torch.long, device=device)
    node_ids = torch.arange(1, num_kept + 1, device=device).expand(batch, num_kept)
    node_of_cand.scatter_(1, kept, node_ids)
    parent_cand = cand_parent.gather(1, kept)
    parent_node = node_of_cand.gather(1, parent_cand.clamp(min=0))
    parent_node = torch.where(parent_cand < 0, torch.zeros_like(parent_node), parent_node)
    # a contract check, made only where it costs no host sync (on a GPU it would wait for the step)
    if parent_node.device.type == "cpu" and bool((parent_node < 0).any()):
        raise ValueError(
            "select_tree kept a candidate whose parent was dropped: candidates must be numbered "
            "parents-first and a child must not outscore its parent"
        )

    root_parent = torch.full((batch, 1), -1, dtype=torch.long, device=device)
    parents = torch.cat([root_parent, parent_node], dim=1)
    token_ids = torch.cat(
        [
            root_token_ids.to(device=device, dtype=torch.long)[:, None],
            cand_token_ids.gather(1, kept),
        ],
        dim=1,
    )
    ranks = torch.cat([torch.zeros((batch, 1), dtype=torch.long, device=device), rank_of_cand.gather(1, kept)], dim=1)
    return DraftTree.from_parents(token_ids, parents, ranks)


def ancestor_mask_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] parent indices (-1 = root) -> [B, N, N] bool, [b, i, j] iff j is i or its ancestor.

    Transitive closure by repeated squaring of (identity | parent edge): log2(depth) batched
    matmuls instead of a Python loop over nodes.
    """
    batch, num_nodes = parents.shape
    reach = torch.eye(num_nodes, dtype=torch.float32, device=parents.device).repeat(batch, 1, 1)
    has_parent = (parents >= 0)[:, :, None].float()
    reach.scatter_add_(2, parents.clamp(min=0)[:, :, None], has_parent)
    reach.clamp_(max=1.0)
    path_len = 1
    while path_len < num_nodes - 1:
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
        path_len *= 2
    return reach > 0
