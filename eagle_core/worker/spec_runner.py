"""EAGLE speculative decoding over a scheduled batch: draft, one target forward, verify.

Per step:
  1. drafter.catch_up: the sequences that draft this step feed their owed draft entries (one
     packed draft forward);
  2. drafter.build_trees: up to depth - 1 batched draft forwards (fewer where the step's trees
     are too small to reach that deep) build each speculating sequence's tree;
     context lookup grafts onto it the tokens that followed the sequence's last few tokens
     where these occurred before (spec/lookup.py); where the head drafts nothing for a
     sequence that has lookup slots, such a chain is the whole tree;
  3. ONE target forward over prefill chunks, plain decode tokens and every tree (tree mask,
     depth-based positions), with logits at every plain sequence's last token and every tree
     node;
  4. one draw per logit row (argmax, or the request's own generator), verification of every tree
     at once (spec/verify.py), then ONE transfer of the step's tokens to the host; KV compaction
     of the accepted paths, and the committed tokens' target features handed to the drafter.

A step in which no sequence has draft slots (the policy let nobody draft) is PlainRunner's step
plus the features kept for the drafter: no draft forward, no tree bookkeeping.
"""

from __future__ import annotations

import torch

from eagle_core.batch import (
    DRAFT_SOURCE,
    HEAD_SOURCE,
    LOOKUP_SOURCE,
    ScheduledBatch,
    SeqResult,
    SeqWork,
    StepResult,
)
from eagle_core.spec.drafter import Drafter
from eagle_core.spec.lookup import ContextLookup, chain_path, graft_chain
from eagle_core.spec.tree import DraftTree
from eagle_core.spec.verify import accepted_path, path_result
from eagle_core.worker.inputs import SeqGroup, block_table_tensor
from eagle_core.worker.model_runner import TargetModel, last_token_rows, pack_works, sample_rows
from eagle_core.worker.sampler import Sampler


class SpecRunner:
    def __init__(
        self, target: TargetModel, sampler: Sampler, drafter: Drafter, lookup: ContextLookup, grammar_drafting: bool = True
    ):
        self.target = target
        self.sampler = sampler
        self.drafter = drafter
        self.lookup = lookup
        self.grammar_drafting = grammar_drafting
        """Prune trees by their request's grammar and add its forced tokens (SpecConfig)."""

    def execute(self, batch: ScheduledBatch) -> StepResult:
        self.sampler.drop(batch.finished_request_ids)
        self.drafter.drop(batch.finished_request_ids)
        self.lookup.drop(batch.finished_request_ids)
        if batch.is_empty:
            return StepResult()
        works = batch.seqs
        if not any(w.num_draft_slots for w in works):
            return self._plain(works)
        roots = self.drafter.catch_up(works)
        head_rows = [i for i, w in enumerate(works) if w.drafts_with_head and w.request_id in roots]
        trees: dict[int, DraftTree] = {}
        if head_rows:
            fed = [roots[works[i].request_id] for i in head_rows]
            root_hidden = torch.stack([f.hidden for f in fed])  # [B, hidden]
            root_top = (torch.stack([f.top_logprobs for f in fed]), torch.stack([f.top_ids for f in fed]))  # [B, top_k]
            trees = dict(zip(head_rows, self.drafter.build_trees([works[i] for i in head_rows], root_hidden, root_top)))
        lookup_from: dict[int, int] = {}  # row -> its tree's first lookup node (UNKNOWN_SOURCES: not known)
        if self.lookup.max_tokens:
            lookup_from = self._graft_lookup(works, trees)
        if self.grammar_drafting and self.sampler.grammars is not None:
            lookup_from |= self._constrain_trees(works, trees)

        plain = [i for i in range(len(works)) if i not in trees]
        groups, offsets = self._groups(works, plain, trees)
        sampled = [i for i in plain if works[i].sample]
        tree_order = list(trees)
        rows = torch.cat(
            [last_token_rows(works, offsets, sampled)]
            + [torch.arange(trees[i].num_nodes) + offsets[i] for i in tree_order]
        )
        out = self.target.forward(groups, rows)
        row_works = [works[i] for i in sampled] + [works[i] for i in tree_order for _ in range(trees[i].num_nodes)]
        histories = self._histories(works, sampled, trees, tree_order)
        depths = torch.cat(
            [torch.zeros(len(sampled), dtype=torch.long, device=out.logits.device)]
            + [trees[i].depths[0].to(out.logits.device) for i in tree_order]
        )  # [R] each row's depth below its root
        drawn = self.sampler.draw(out.logits, row_works, histories, depths)  # [R]
        results = self._results(works, sampled, trees, tree_order, drawn, out.logits, lookup_from)
        self._commit(works, trees, results, out.features, offsets)
        return StepResult(results)

    def _plain(self, works: list[SeqWork]) -> StepResult:
        """A step in which nobody drafts: PlainRunner's step, and the committed tokens'
        features kept for the draft head (no draft forward)."""
        self.drafter.track(works)
        groups, offsets = pack_works(works, self.target.block_size)
        rows = [i for i, w in enumerate(works) if w.sample]
        out = self.target.forward(groups, last_token_rows(works, offsets, rows))
        results = sample_rows(self.sampler, out.logits, [works[i] for i in rows])
        self._commit(works, {}, results, out.features, offsets)
        return StepResult(results)

    def _groups(
        self, works: list[SeqWork], plain: list[int], trees: dict[int, DraftTree]
    ) -> tuple[list[SeqGroup], list[int]]:
        """The target forward's groups (plain works as in PlainRunner, then trees of equal size
        together) and each work's first packed index."""
        groups, plain_offsets = pack_works([works[i] for i in plain], self.target.block_size)
        offsets = [0] * len(works)
        total = sum(g.num_tokens for g in groups)
        for i, offset in zip(plain, plain_offsets):
            offsets[i] = offset
        by_size: dict[int, list[int]] = {}
        for i, tree in trees.items():
            by_size.setdefault(tree.num_nodes, []).append(i)
        for size, members in by_size.items():
            groups.append(self._tree_group([works[i] for i in members], [trees[i] for i in members]))
            for k, i in enumerate(members):
                offsets[i] = total + k * size
            total += len(members) * size
        return groups, offsets

    def _tree_group(self, works: list[SeqWork], trees: list[DraftTree]) -> SeqGroup:
        """Trees of N nodes each: node n is stored at start + n (the slots the scheduler
        reserved), sits at RoPE position start + depth and sees the context and its ancestors."""
        for work, tree in zip(works, trees):
            assert tree.num_nodes <= work.num_draft_slots + 1, (tree.num_nodes, work.num_draft_slots)
        num_nodes = trees[0].num_nodes
        starts = torch.tensor([w.start_pos for w in works])  # [B]
        device = trees[0].token_ids.device
        return SeqGroup(
            token_ids=torch.cat([t.token_ids for t in trees]),  # [B, N]
            start_pos=starts,
            block_tables=block_table_tensor([w.block_table for w in works]),
            key_len=int(starts.max()) + num_nodes,
            positions=starts.to(device)[:, None] + torch.cat([t.depths for t in trees]),
            committed_len=starts,
            tail_mask=torch.cat([t.ancestor_mask for t in trees]),  # [B, N, N]
        )

    def _graft_lookup(self, works: list[SeqWork], trees: dict[int, DraftTree]) -> dict[int, int]:
        """Graft each decode step's lookup chain onto its head tree in `trees`, or make it the
        step's whole tree where the head drafts none (above --spec-max-batch). Returns row ->
        the first node the chain added (nodes before it are the head's)."""
        lookup_from: dict[int, int] = {}
        grafts: dict[int, tuple[list[int], int]] = {}  # row -> (chain, free slots)
        for i, work in enumerate(works):
            room = work.num_draft_slots - (trees[i].num_nodes - 1 if i in trees else 0)
            if not work.sample or room <= 0:
                continue
            chain = self.lookup.chain(work.request_id, work.prompt_token_ids, work.output_token_ids)
            if chain:
                grafts[i] = (chain, room)
        host = _host_trees(works, trees, list(grafts))
        for i, (chain, room) in grafts.items():
            tree_tokens, tree_parents, tree_ranks = host[i]
            token_ids, parents = graft_chain(tree_tokens, tree_parents, chain, room)
            if len(token_ids) > len(tree_tokens):
                lookup_from[i] = len(tree_tokens)
                # the chain's nodes (drafted by the head or not) would be there with any head tree
                ranks = tree_ranks + [0] * (len(token_ids) - len(tree_tokens))
                for node in chain_path(token_ids, parents, chain):
                    ranks[node] = 0
                trees[i] = DraftTree.from_parents(
                    torch.tensor([token_ids], device=self.drafter.device),  # [1, N]
                    torch.tensor([parents], device=self.drafter.device),  # [1, N]
                    torch.tensor([ranks], device=self.drafter.device) if ranks[0] >= 0 else None,  # [1, N]
                )
        return lookup_from

    def _constrain_trees(self, works: list[SeqWork], trees: dict[int, DraftTree]) -> dict[int, int]:
        """Structured-output decode steps: their trees without the nodes the grammar forbids,
        plus the tokens it forces (GrammarMasks.constrain_tree); a tree left with its root
        alone is dropped (the step decodes plainly). Returns row -> UNKNOWN_SOURCES for the
        trees it rebuilt (whose nodes' sources it does not track)."""
        rows = [i for i, w in enumerate(works) if w.params.grammar is not None and w.sample and w.num_draft_slots > 0]
        rebuilt: dict[int, int] = {}
        if not rows:
            return rebuilt
        host = _host_trees(works, trees, rows)
        for i in rows:
            work = works[i]
            tokens, parents, _ = host[i]
            new_tokens, new_parents = self.sampler.grammars.constrain_tree(
                work.request_id, work.params.grammar, work.output_token_ids, tokens, parents, work.num_draft_slots
            )
            if len(new_tokens) == 1:
                trees.pop(i, None)
            elif (new_tokens, new_parents) != (tokens, parents):
                trees[i] = DraftTree.from_parents(
                    torch.tensor([new_tokens], device=self.drafter.device),  # [1, N]
                    torch.tensor([new_parents], device=self.drafter.device),  # [1, N]
                )
                rebuilt[i] = UNKNOWN_SOURCES
        return rebuilt

    @staticmethod
    def _histories(
        works: list[SeqWork], sampled: list[int], trees: dict[int, DraftTree], tree_order: list[int]
    ) -> list[list[int]] | None:
        """Output tokens preceding each logit row's sample (output so far, plus the path below
        the root for tree nodes); None when no row needs them (SeqWork.needs_histories)."""
        rows = [works[i] for i in sampled] + [works[i] for i in tree_order]
        if not any(w.needs_histories for w in rows):
            return None
        histories = [list(works[i].output_token_ids) for i in sampled]
        for i in tree_order:
            tree = trees[i]
            parents, tokens = tree.parents[0].tolist(), tree.token_ids[0].tolist()
            own = [list(works[i].output_token_ids)]
            for node in range(1, tree.num_nodes):
                own.append(own[parents[node]] + [tokens[node]])
            histories += own
        return histories

    def _results(
        self,
        works: list[SeqWork],
        sampled: list[int],
        trees: dict[int, DraftTree],
        tree_order: list[int],
        drawn: torch.Tensor,  # [R] the token drawn at every logit row
        logits: torch.Tensor,  # [R, vocab]
        lookup_from: dict[int, int],
    ) -> dict[str, SeqResult]:
        """Verify every tree at once and bring the step's tokens to the host in one transfer."""
        num_plain = len(sampled)
        parts = [drawn]
        if tree_order:
            tree = _padded_trees([trees[i] for i in tree_order])  # [S, N]
            node_rows = _node_rows([trees[i].num_nodes for i in tree_order], tree.num_nodes, num_plain)
            node_drawn = drawn[node_rows.to(drawn.device)]  # [S, N]
            last, on_path = accepted_path(tree, node_drawn)
            parts += [last, on_path.reshape(-1).long(), tree.token_ids.reshape(-1), tree.ranks.reshape(-1)]
        host = torch.cat(parts).tolist()  # the step's one device-to-host transfer
        results: dict[str, SeqResult] = {}
        for k, i in enumerate(sampled):
            results[works[i].request_id] = SeqResult(works[i].request_id, [host[k]])
        logprob_rows: dict[str, list[int]] = {}
        if tree_order:
            num_trees, width = len(tree_order), tree.num_nodes
            base = len(drawn)
            lasts = host[base : base + num_trees]
            paths = host[base + num_trees : base + num_trees + num_trees * width]
            tokens = host[base + num_trees + num_trees * width : base + num_trees + 2 * num_trees * width]
            ranks = host[base + num_trees + 2 * num_trees * width :]
            first_row = num_plain
            for k, i in enumerate(tree_order):
                work = works[i]
                row_tokens = tokens[k * width : (k + 1) * width]
                bonus = host[first_row + lasts[k]]
                nodes, new_tokens = path_result(paths[k * width : (k + 1) * width], row_tokens, bonus, work.max_new_tokens)
                row_ranks = ranks[k * width : (k + 1) * width]
                results[work.request_id] = SeqResult(
                    work.request_id,
                    new_tokens,
                    num_draft_tokens=trees[i].num_nodes - 1,
                    num_accepted_tokens=len(nodes),
                    accepted_nodes=nodes,
                    accepted_ranks=[row_ranks[n] for n in nodes] if row_ranks[0] >= 0 else None,
                    draft_sources=_draft_sources(nodes, lookup_from.get(i, width)),
                )
                logprob_rows[work.request_id] = [first_row + n for n in [0, *nodes][: len(new_tokens)]]
                first_row += trees[i].num_nodes
        for k, i in enumerate(sampled):
            logprob_rows[works[i].request_id] = [k]
        self._add_logprobs(works, results, logprob_rows, logits)
        return results

    def _add_logprobs(self, works, results, logprob_rows, logits) -> None:
        """Log-probabilities of the emitted tokens, for the requests that asked for them."""
        wanted = [w for w in works if w.params.logprobs is not None and w.request_id in results]
        if not wanted:
            return
        rows = [r for w in wanted for r in logprob_rows[w.request_id]]
        tokens = [t for w in wanted for t in results[w.request_id].new_token_ids]
        row_works = [w for w in wanted for _ in logprob_rows[w.request_id]]
        logprobs = self.sampler.logprobs(logits[torch.tensor(rows, device=logits.device)], tokens, row_works)
        start = 0
        for work in wanted:
            count = len(results[work.request_id].new_token_ids)
            results[work.request_id].logprobs = logprobs[start : start + count]
            start += count

    def _commit(self, works, trees, results, features: torch.Tensor, offsets: list[int]) -> None:
        """Keep the accepted paths' KV and hand the committed tokens' features to the drafter.

        The committed rows of every work come out of `features` in one gather, so what the
        drafter holds is exactly those rows (never a view that keeps the whole step alive)."""
        src, dst, rows, counts = [], [], [], []
        for i, work in enumerate(works):
            if i in trees:
                accepted = results[work.request_id].accepted_nodes
                moves = accepted_path_moves(work.block_table, work.start_pos, accepted, self.target.block_size)
                src += moves[0]
                dst += moves[1]
                own = [offsets[i] + r for r in [0, *accepted]]
            else:
                own = list(range(offsets[i], offsets[i] + len(work.token_ids)))
            rows += own
            counts.append(len(own))
        committed = features[torch.tensor(rows, device=features.device)]  # [sum(counts), feature]
        for work, chunk in zip(works, committed.split(counts)):
            self.drafter.record(work.request_id, chunk)
        if src:
            device = features.device
            self.target.kv.move(torch.tensor(src, device=device), torch.tensor(dst, device=device))


UNKNOWN_SOURCES = -1
"""lookup_from's value for a tree whose nodes' sources are not tracked (rebuilt by a grammar)."""


def _draft_sources(nodes: list[int], lookup_from: int) -> list[str]:
    """Each accepted node's source: the head's tree before `lookup_from`, the context lookup's
    chain from it on (a chain only extends a path, so a path is head nodes, then lookup ones)."""
    if lookup_from == UNKNOWN_SOURCES:
        return [DRAFT_SOURCE] * len(nodes)
    return [HEAD_SOURCE if n < lookup_from else LOOKUP_SOURCE for n in nodes]


def _host_trees(
    works: list[SeqWork], trees: dict[int, DraftTree], rows: list[int]
) -> dict[int, tuple[list[int], list[int], list[int]]]:
    """Row -> (token ids, parent indices, ranks; -1 where unknown) of its tree, or of its root
    alone where it has none. The trees come to the host in one transfer: on a GPU each transfer
    waits for the queued draft forwards, so one per sequence would stall the step that many
    times."""
    on_device = [i for i in rows if i in trees]
    host: list[list[int]] = [[], [], []]
    if on_device:
        host = torch.cat(
            [torch.stack([trees[i].token_ids[0], trees[i].parents[0], _ranks(trees[i])[0]]) for i in on_device], 1
        ).tolist()
    out, start = {}, 0
    for i in rows:
        if i in trees:
            end = start + trees[i].num_nodes
            out[i] = (host[0][start:end], host[1][start:end], host[2][start:end])
            start = end
        else:
            out[i] = ([works[i].token_ids[-1]], [-1], [0])  # the root alone
    return out


def _ranks(tree: DraftTree) -> torch.Tensor:
    """[B, N] the tree's node ranks, -1 where unknown."""
    return tree.ranks if tree.ranks is not None else torch.full_like(tree.token_ids, -1)


def _padded_trees(trees: list[DraftTree]) -> DraftTree:
    """One [S, N] batch of single-sequence trees, N the largest; padding nodes carry token -1
    (never accepted), hang off the root and see only themselves. Ranks are -1 for a tree whose
    ranks are unknown."""
    width = max(t.num_nodes for t in trees)
    device = trees[0].token_ids.device
    token_ids = torch.full((len(trees), width), -1, dtype=torch.long, device=device)
    parents = torch.zeros(len(trees), width, dtype=torch.long, device=device)
    depths = torch.ones(len(trees), width, dtype=torch.long, device=device)
    mask = torch.eye(width, dtype=torch.bool, device=device).repeat(len(trees), 1, 1)
    ranks = torch.zeros(len(trees), width, dtype=torch.long, device=device)
    for s, tree in enumerate(trees):
        n = tree.num_nodes
        token_ids[s, :n] = tree.token_ids[0]
        parents[s, :n] = tree.parents[0]
        depths[s, :n] = tree.depths[0]
        mask[s, :n, :n] = tree.ancestor_mask[0]
        ranks[s, :n] = _ranks(tree)[0]
    return DraftTree(token_ids, parents, depths, mask, ranks)


def _node_rows(sizes: list[int], width: int, first: int) -> torch.Tensor:
    """[S, width] logit row of every node (tree s's rows follow tree s-1's, from `first`);
    padding nodes point at their tree's root row."""
    starts = torch.tensor(sizes).cumsum(0) - torch.tensor(sizes) + first  # [S]
    nodes = torch.arange(width)[None, :].expand(len(sizes), width)
    nodes = torch.where(nodes < torch.tensor(sizes)[:, None], nodes, 0)
    return starts[:, None] + nodes


def accepted_path_moves(
    block_table: list[int], start: int, accepted: list[int], block_size: int
) -> tuple[list[int], list[int]]:
    """KV slot moves (src, dst) that make an accepted path contiguous.

    Tree node n was stored at position start + n (the root at `start`); the k-th accepted node
    must end up at start + k so the sequence's KV is contiguous again. Nodes already in place
    are not moved. Path nodes have increasing indices, so every destination is at or before
    its source."""

    def slot(position: int) -> int:
        return block_table[position // block_size] * block_size + position % block_size

    src, dst = [], []
    for k, node in enumerate(accepted, start=1):
        if node != k:
            src.append(slot(start + node))
            dst.append(slot(start + k))
    return src, dst
