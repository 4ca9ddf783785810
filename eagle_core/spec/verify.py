"""Verifying a draft tree against the target model's outputs at every tree node.

The target runs the whole tree (root + drafts) in one forward with the tree's ancestor mask, so
for every node it gives the distribution of the token that follows that node's path.

Terms:
- draft token: the token of a non-root tree node, proposed by the draft head.
- accepted token: a draft token the target agrees with, all of whose ancestors were accepted
  too. Greedy: it equals the target's argmax at its parent. Sampling: the target's draw at its
  parent came out equal to it. The accepted tokens form one root-to-node path.
- bonus token: the target's own choice at the last accepted node (the root when nothing was
  accepted). Exactly one per step; it is not in the target's KV yet and becomes the next root.
- acceptance length (tau): tokens emitted by the step = accepted tokens + the bonus token.

Lossless sampling for deterministic (top-k) drafts: at the current node draw y from the target's
processed distribution p; if y is the token of one of the node's children, descend into it,
otherwise emit y as the bonus token and stop (at a leaf the draw is always the bonus). Every
emitted token is a draw from p at its own prefix, so the output is distributed exactly as plain
sampling from the target. This equals EAGLE's "accept child x with probability p(x), else zero
p(x), renormalise and try the next sibling".

`max_new_tokens` cuts a step short: at most that many tokens are emitted, a prefix of the path,
and the last one is the target's own choice at its node (it counts as the bonus token, so
`len(new_token_ids) == len(accepted_nodes) + 1` always holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_core.sampling import sample_from_probs
from eagle_core.spec.tree import DraftTree


@dataclass
class Verification:
    accepted_nodes: list[list[int]]
    """Per sequence, the tree node indices along the accepted path, root excluded."""
    new_token_ids: list[list[int]]
    """Per sequence, the accepted draft tokens followed by the bonus token."""

    @property
    def num_accepted(self) -> list[int]:
        return [len(nodes) for nodes in self.accepted_nodes]


def verify_greedy(
    tree: DraftTree,
    target_argmax: torch.Tensor,  # [B, N] long, the target's argmax at every node
    max_new_tokens: list[int] | None = None,
) -> Verification:
    """Accept the longest path whose every token equals the target's argmax at its parent.

    If siblings carry the same token (a drafter should not produce that), the deepest accepted
    node wins, the earliest among equally deep ones.
    """
    limits = _check_limits(max_new_tokens, tree.batch_size)
    argmax = target_argmax.to(tree.token_ids.device)
    expected = argmax.gather(1, tree.parents.clamp(min=0))  # [B, N] target's pick at the parent
    token_ok = tree.token_ids == expected
    token_ok[:, 0] = True
    # a node is accepted iff no node on its root path (itself included) fails
    accepted = ~(tree.ancestor_mask & ~token_ok[:, None, :]).any(dim=-1)  # [B, N]
    depth_if_accepted = torch.where(accepted, tree.depths, torch.full_like(tree.depths, -1))
    last = depth_if_accepted.argmax(dim=1)  # [B] deepest accepted node, first on ties
    batch = torch.arange(tree.batch_size, device=last.device)
    on_path = tree.ancestor_mask[batch, last]  # [B, N]
    bonus = argmax.gather(1, last[:, None])[:, 0]  # [B]

    accepted_nodes, new_token_ids = [], []
    for path_b, tokens_b, bonus_b, limit in zip(
        on_path.tolist(), tree.token_ids.tolist(), bonus.tolist(), limits, strict=True
    ):
        nodes = [i for i, on in enumerate(path_b) if on and i > 0]
        tokens = [tokens_b[i] for i in nodes] + [bonus_b]
        if limit is not None and len(tokens) > limit:
            # tokens[limit - 1] is a draft equal to the target's argmax at nodes[limit - 2]
            nodes, tokens = nodes[: limit - 1], tokens[:limit]
        accepted_nodes.append(nodes)
        new_token_ids.append(tokens)
    return Verification(accepted_nodes, new_token_ids)


def verify_sampling(
    tree: DraftTree,
    target_probs: torch.Tensor,  # [B, N, V] processed target distribution at every node
    generators: list[torch.Generator],
    max_new_tokens: list[int] | None = None,
) -> Verification:
    """Walk down the tree drawing from the target at each node (see the module docstring).

    Each draw goes through `sample_from_probs` with the sequence's own generator, one draw per
    visited node, so a seeded request gets the same tokens alone or in any batch.
    """
    limits = _check_limits(max_new_tokens, tree.batch_size)
    if len(generators) != tree.batch_size:
        raise ValueError(f"need {tree.batch_size} generators, got {len(generators)}")
    token_ids = tree.token_ids.tolist()
    parents = tree.parents.tolist()

    accepted_nodes, new_token_ids = [], []
    for b in range(tree.batch_size):
        children: list[list[int]] = [[] for _ in parents[b]]
        for node, parent in enumerate(parents[b]):
            if parent >= 0:
                children[parent].append(node)
        limit = limits[b]
        node, nodes, tokens = 0, [], []
        while True:
            drawn = sample_from_probs(target_probs[b, node], generators[b])
            tokens.append(drawn)
            if limit is not None and len(tokens) >= limit:
                break
            child = next((c for c in children[node] if token_ids[b][c] == drawn), None)
            if child is None:
                break
            nodes.append(child)
            node = child
        accepted_nodes.append(nodes)
        new_token_ids.append(tokens)
    return Verification(accepted_nodes, new_token_ids)


def _check_limits(max_new_tokens: list[int] | None, batch_size: int) -> list[int | None]:
    if max_new_tokens is None:
        return [None] * batch_size
    if len(max_new_tokens) != batch_size:
        raise ValueError(f"need {batch_size} max_new_tokens, got {len(max_new_tokens)}")
    if any(limit < 1 for limit in max_new_tokens):
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return list(max_new_tokens)
