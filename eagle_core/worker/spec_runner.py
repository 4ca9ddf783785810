"""EAGLE speculative decoding over a scheduled batch: draft, one target forward, verify.

Per step:
  1. drafter.catch_up: the sequences that draft this step feed their owed draft entries (one
     packed draft forward);
  2. drafter.build_trees: depth - 1 batched draft forwards build each speculating sequence's tree;
     context lookup grafts onto it the tokens that followed the sequence's last few tokens
     where these occurred before (spec/lookup.py); above --spec-max-batch, where the head
     drafts nothing, such a chain is the whole tree;
  3. ONE target forward over prefill chunks, plain decode tokens and every tree (tree mask,
     depth-based positions);
  4. verification per sequence (greedy or lossless sampling), KV compaction of the accepted path,
     and the committed tokens' target features handed back to the drafter.
"""

from __future__ import annotations

import torch

from eagle_core.batch import ScheduledBatch, SeqResult, SeqWork, StepResult
from eagle_core.spec.drafter import Drafter
from eagle_core.spec.lookup import ContextLookup, graft_chain
from eagle_core.spec.tree import DraftTree
from eagle_core.spec.verify import Verification, verify_greedy, verify_sampling
from eagle_core.worker.inputs import SeqInput
from eagle_core.worker.model_runner import TargetModel, sample_last_tokens, work_input
from eagle_core.worker.sampler import Sampler


class SpecRunner:
    def __init__(self, target: TargetModel, sampler: Sampler, drafter: Drafter, lookup: ContextLookup):
        self.target = target
        self.sampler = sampler
        self.drafter = drafter
        self.lookup = lookup
        self.layer_ids = getattr(drafter.head, "layer_ids", None)
        """EAGLE-3 reads three intermediate layers; EAGLE-1/2 the final-norm output."""

    def execute(self, batch: ScheduledBatch) -> StepResult:
        self.sampler.drop(batch.finished_request_ids)
        self.drafter.drop(batch.finished_request_ids)
        self.lookup.drop(batch.finished_request_ids)
        if batch.is_empty:
            return StepResult()
        works = batch.seqs
        root_hidden = self.drafter.catch_up(works)
        head_rows = [i for i, w in enumerate(works) if w.drafts_with_head and w.request_id in root_hidden]
        trees: dict[int, DraftTree] = {}
        if head_rows:
            head_works = [works[i] for i in head_rows]
            stacked = torch.stack([root_hidden[w.request_id] for w in head_works])  # [B, hidden]
            trees = dict(zip(head_rows, self.drafter.build_trees(head_works, stacked)))
        if self.lookup.max_tokens:
            self._graft_lookup(works, trees)

        seqs = [self._tree_input(w, trees[i]) if i in trees else work_input(w) for i, w in enumerate(works)]
        hidden, offsets, all_hidden = self.target.forward(seqs, output_hidden_states=self.layer_ids is not None)
        features = self._features(hidden, all_hidden)  # [T, feature]

        results: dict[str, SeqResult] = {}
        plain = [i for i, w in enumerate(works) if w.sample and i not in trees]
        results.update(sample_last_tokens(self.target, self.sampler, hidden, offsets, works, plain))
        if trees:
            # One LM-head matmul over every tree node of every sequence: [sum of N, vocab].
            rows = torch.cat([torch.arange(trees[i].num_nodes) + offsets[i] for i in trees]).to(hidden.device)
            logits = self.target.logits(hidden[rows])
            argmax = logits.argmax(dim=-1).tolist()
            start = 0
            for i, tree in trees.items():
                end = start + tree.num_nodes
                results[works[i].request_id] = self._verify(works[i], tree, logits[start:end], argmax[start:end])
                start = end
        self._commit(works, trees, results, features, offsets)
        return StepResult(results)

    def _graft_lookup(self, works: list[SeqWork], trees: dict[int, DraftTree]) -> None:
        """Graft each decode step's lookup chain onto its head tree in `trees`, or make it the
        step's whole tree where the head drafts none (above --spec-max-batch)."""
        grafts: dict[int, tuple[list[int], int]] = {}  # row -> (chain, free slots)
        for i, work in enumerate(works):
            room = work.num_draft_slots - (trees[i].num_nodes - 1 if i in trees else 0)
            if not work.sample or room <= 0:
                continue
            chain = self.lookup.chain(work.request_id, work.prompt_token_ids, work.output_token_ids)
            if chain:
                grafts[i] = (chain, room)
        on_head = [i for i in grafts if i in trees]
        # The head's trees come to the host in one transfer: on a GPU each transfer waits for
        # the queued draft forwards, so one per sequence would stall the step that many times.
        host = [[], []]
        if on_head:
            host = torch.cat([torch.stack([trees[i].token_ids[0], trees[i].parents[0]]) for i in on_head], 1).tolist()
        start = 0
        for i, (chain, room) in grafts.items():
            if i in trees:
                end = start + trees[i].num_nodes
                tree_tokens, tree_parents = host[0][start:end], host[1][start:end]
                start = end
            else:
                tree_tokens, tree_parents = [works[i].token_ids[-1]], [-1]  # the root alone
            token_ids, parents = graft_chain(tree_tokens, tree_parents, chain, room)
            if len(token_ids) > len(tree_tokens):
                trees[i] = DraftTree.from_parents(
                    torch.tensor([token_ids], device=self.drafter.device),  # [1, N]
                    torch.tensor([parents], device=self.drafter.device),  # [1, N]
                )

    def _tree_input(self, work: SeqWork, tree: DraftTree) -> SeqInput:
        # The tree's nodes past the root are written into the KV slots the scheduler reserved.
        assert tree.num_nodes <= work.num_draft_slots + 1, (tree.num_nodes, work.num_draft_slots)
        start = work.start_pos
        return SeqInput(
            token_ids=tree.token_ids[0],
            start_pos=start,
            block_table=work.block_table,
            rope_positions=start + tree.depths[0],
            committed_len=start,
            tail_mask=tree.ancestor_mask[0],
        )

    def _features(self, hidden: torch.Tensor, all_hidden) -> torch.Tensor:
        if self.layer_ids is None:
            return hidden  # [T, hidden]: the final norm's output, the LM head's input
        return torch.cat([all_hidden[i][0] for i in self.layer_ids], dim=-1)  # [T, 3 * hidden]

    def _verify(
        self,
        work: SeqWork,
        tree: DraftTree,
        logits: torch.Tensor,  # [N, vocab] float32, the target at every node
        argmax: list[int],  # [N]
    ) -> SeqResult:
        num_nodes = tree.num_nodes
        limit = [work.max_new_tokens]
        if work.params.greedy and not work.params.needs_penalties and not work.holds_back_stop_tokens:
            verification = verify_greedy(tree, torch.tensor([argmax]), limit)
        else:
            probs = self.sampler.process(logits, [work] * num_nodes, self._histories(work, tree))
            generator = self.sampler.generator(work.request_id, work.params)
            verification = verify_sampling(tree, probs[None], [generator], limit)
        return self._result(work, tree, logits, verification)

    @staticmethod
    def _histories(work: SeqWork, tree: DraftTree) -> list[list[int]]:
        """Output tokens preceding each node's sample: output so far + the path below the root."""
        parents = tree.parents[0].tolist()
        tokens = tree.token_ids[0].tolist()
        histories = [list(work.output_token_ids)]
        for node in range(1, tree.num_nodes):
            histories.append(histories[parents[node]] + [tokens[node]])
        return histories

    def _result(self, work: SeqWork, tree: DraftTree, logits: torch.Tensor, verification: Verification) -> SeqResult:
        accepted = verification.accepted_nodes[0]
        new_tokens = verification.new_token_ids[0]
        logprobs = None
        if work.params.logprobs is not None:
            path = torch.tensor([0, *accepted][: len(new_tokens)], device=logits.device)
            logprobs = self.sampler.logprobs(logits[path], new_tokens, [work] * len(new_tokens))
        return SeqResult(
            work.request_id,
            new_tokens,
            num_draft_tokens=tree.num_nodes - 1,
            num_accepted_tokens=len(accepted),
            logprobs=logprobs,
            accepted_nodes=accepted,
        )

    def _commit(self, works, trees, results, features: torch.Tensor, offsets: list[int]) -> None:
        """Keep the accepted paths' KV and hand the committed tokens' features to the drafter."""
        src, dst = [], []
        for i, work in enumerate(works):
            if i in trees:
                accepted = results[work.request_id].accepted_nodes
                rows = [0, *accepted]
                moves = accepted_path_moves(work.block_table, work.start_pos, accepted, self.target.block_size)
                src += moves[0]
                dst += moves[1]
            else:
                rows = list(range(len(work.token_ids)))
            index = torch.tensor([offsets[i] + r for r in rows], device=features.device)
            self.drafter.record(work.request_id, features[index])
        if src:
            device = features.device
            self.target.kv.move(torch.tensor(src, device=device), torch.tensor(dst, device=device))


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
