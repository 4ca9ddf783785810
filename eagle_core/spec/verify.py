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

Lossless sampling for deterministic (top-k) drafts: every node gets one draw y from the target's
processed distribution p at that node, made before the walk from the uniform of the node's
output position (eagle_core/sampling.py: a node at depth d below a root with n output tokens
before it uses position n + d, as plain decoding would). Walk down from the root: if y at the
current node is the token of one of its children, descend into it, otherwise emit y as the
bonus token and stop (at a leaf the draw is always the bonus). The walk visits one node per depth, and which node it visits at depth
d depends only on the uniforms of smaller depths, so every emitted token is a draw from p at its
own prefix: the output is distributed exactly as plain sampling from the target, and for a given
key it is the very text plain decoding draws. This equals EAGLE's "accept child x with
probability p(x), else zero p(x), renormalise and try the next sibling" in distribution.
Greedy verification is the same walk with y = the target's argmax.

`max_new_tokens` cuts a step short: at most that many tokens are emitted, a prefix of the path,
and the last one is the target's own choice at its node (it counts as the bonus token, so
`len(new_token_ids) == len(accepted_nodes) + 1` always holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_core.sampling import inverse_cdf, position_uniforms
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


def accepted_path(
    tree: DraftTree,
    drawn: torch.Tensor,  # [B, N] long, the target's token (argmax or draw) at every node
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched, sync-free acceptance: ([B] the last accepted node, [B, N] bool its root path).

    A node is accepted iff every node on its root path (itself included, the root excepted)
    carries the token drawn at its parent. The last accepted node is the deepest one, the
    earliest among equally deep ones (siblings with equal tokens: a drafter should not make them).
    Padding nodes (token -1) are never accepted."""
    expected = drawn.gather(1, tree.parents.clamp(min=0))  # [B, N] the draw at each node's parent
    token_ok = tree.token_ids == expected
    token_ok[:, 0] = True
    # a node is accepted iff no node on its root path (itself included) fails
    accepted = ~(tree.ancestor_mask & ~token_ok[:, None, :]).any(dim=-1)  # [B, N]
    depth_if_accepted = torch.where(accepted, tree.depths, torch.full_like(tree.depths, -1))
    last = depth_if_accepted.argmax(dim=1)  # [B]
    batch = torch.arange(tree.batch_size, device=last.device)
    return last, tree.ancestor_mask[batch, last]


def path_result(
    path_mask: list[bool],  # [N] the accepted path (root included)
    token_ids: list[int],  # [N] the tree's tokens
    bonus: int,
    limit: int | None,
) -> tuple[list[int], list[int]]:
    """(accepted nodes, emitted tokens) of one sequence, cut to `limit` tokens."""
    nodes = [i for i, on in enumerate(path_mask) if on and i > 0]
    tokens = [token_ids[i] for i in nodes] + [bonus]
    if limit is not None and len(tokens) > limit:
        # tokens[limit - 1] is a draft equal to the target's token at nodes[limit - 2]
        nodes, tokens = nodes[: limit - 1], tokens[:limit]
    return nodes, tokens


def verify_greedy(
    tree: DraftTree,
    target_argmax: torch.Tensor,  # [B, N] long, the target's argmax at every node
    max_new_tokens: list[int] | None = None,
) -> Verification:
    """Accept the longest path whose every token equals the target's argmax at its parent."""
    return _verify(tree, target_argmax.to(tree.token_ids.device), max_new_tokens)


def verify_sampling(
    tree: DraftTree,
    target_probs: torch.Tensor,  # [B, N, V] processed target distribution at every node
    keys: list[int],  # each sequence's request key (sampling.request_key)
    num_output: list[int],  # each sequence's output tokens before the root's sample
    max_new_tokens: list[int] | None = None,
) -> Verification:
    """Draw at every node the token of its output position (num_output + depth, as plain
    decoding would), then walk (see the module docstring): a seeded request gets the same tokens
    alone, in any batch, and without speculation."""
    if len(keys) != tree.batch_size or len(num_output) != tree.batch_size:
        raise ValueError(f"need {tree.batch_size} keys and output counts, got {len(keys)} and {len(num_output)}")
    batch, num_nodes, vocab = target_probs.shape
    device = target_probs.device
    row_keys = torch.tensor(keys, device=device)[:, None].expand(batch, num_nodes)
    positions = torch.tensor(num_output, device=device)[:, None] + tree.depths.to(device)  # [B, N]
    uniforms = position_uniforms(row_keys.reshape(-1), positions.reshape(-1))
    drawn = inverse_cdf(target_probs.reshape(batch * num_nodes, vocab), uniforms).view(batch, num_nodes)
    return _verify(tree, drawn.to(tree.token_ids.device), max_new_tokens)


def _verify(tree: DraftTree, drawn: torch.Tensor, max_new_tokens: list[int] | None) -> Verification:
    limits = _check_limits(max_new_tokens, tree.batch_size)
    last, on_path = accepted_path(tree, drawn)
    bonus = drawn.gather(1, last[:, None])[:, 0]  # [B]
    accepted_nodes, new_token_ids = [], []
    for path_b, tokens_b, bonus_b, limit in zip(
        on_path.tolist(), tree.token_ids.tolist(), bonus.tolist(), limits, strict=True
    ):
        nodes, tokens = path_result(path_b, tokens_b, bonus_b, limit)
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
