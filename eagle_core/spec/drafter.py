"""Batched EAGLE-2 drafting with the draft head's own paged KV.

Alignment: the draft head's entry at position p reads (token p+1, target feature f_p) and
predicts f_{p+1}, whose logits propose token p+2. Its KV lives in a separate `KVStorage`
(a layer per head layer) addressed by the SAME block tables as the target's, so the scheduler's
blocks cover both. A step drafts in two phases, before the target forward:

1. catch-up: every sequence that drafts this step feeds the entries it owes (positions whose
   target features arrived in earlier steps: a prefill chunk, or the root plus accepted tokens),
   all packed into one draft forward; sequences that do not draft this step feed theirs later
   (see `catch_up`). The last entry of a decoding sequence reads the root (the last sampled
   token) and gives the root's children.
2. tree levels: depth - 1 more forwards over the top_k frontier nodes of every speculating
   sequence. These entries are provisional: they sit at positions past the sequence's context
   (in its reserved blocks, then in per-row scratch blocks beyond the shared pool) and are
   overwritten by the next step's catch-up, so the draft KV keeps committed tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_core.batch import SeqWork, token_range
from eagle_core.config import SpecConfig
from eagle_core.kv import blocks_needed
from eagle_core.spec.tree import CandidatePool, DraftTree, expand_frontier
from eagle_core.worker.inputs import SeqInput, build_inputs
from eagle_core.worker.kv_storage import KVStorage
from eagle_core.worker.model_runner import kv_shape


@dataclass
class DraftState:
    """Per-request drafting state. Invariant at a step's start: draft_len + len(pending) equals
    the number of tokens in the target's KV."""

    draft_len: int = 0
    """Positions 0..draft_len-1 have committed draft KV."""
    pending: torch.Tensor | None = (
        None  # [c, feature] target features of draft_len .. draft_len+c-1
    )

    @property
    def num_pending(self) -> int:
        return 0 if self.pending is None else self.pending.shape[0]


class Drafter:
    def __init__(
        self,
        head: torch.nn.Module,
        spec: SpecConfig,
        num_pool_blocks: int,
        block_size: int,
        max_num_seqs: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.head = head
        self.spec = spec
        self.block_size = block_size
        self.device = device
        tree_entries = (spec.depth - 1) * spec.top_k
        self.scratch_blocks = blocks_needed(tree_entries, block_size) + 1
        self.scratch_start = num_pool_blocks
        total_blocks = num_pool_blocks + max_num_seqs * self.scratch_blocks
        num_layers, num_kv_heads, head_dim = kv_shape(head.config)
        self.kv = KVStorage(num_layers, total_blocks * block_size, num_kv_heads, head_dim, dtype, device)
        self.states: dict[str, DraftState] = {}

    # ---- state --------------------------------------------------------------------------

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.states.pop(request_id, None)

    def state(self, work: SeqWork) -> DraftState:
        """The request's state, reset when its KV was recomputed from scratch (preemption)."""
        state = self.states.get(work.request_id)
        if state is None or state.draft_len + state.num_pending != work.start_pos:
            state = DraftState()
            self.states[work.request_id] = state
        return state

    def record(self, request_id: str, features: torch.Tensor) -> None:
        """Features ([c, feature]) of the tokens the target just committed, owed to the draft."""
        state = self.states[request_id]
        state.pending = features if state.pending is None else torch.cat([state.pending, features])

    # ---- phase 1 ----------------------------------------------------------------------------

    @torch.inference_mode()
    def catch_up(self, works: list[SeqWork]) -> dict[str, torch.Tensor]:
        """Feed owed entries; returns the last entry's output ([hidden]) per request fed.

        Sequences whose tree the head drafts this step are always fed. The others (plain or
        lookup-only decoding above --spec-max-batch, prefill chunks) keep their features owed:
        one packed forward over many owed entries costs about what a forward over one entry per
        sequence costs, so catching every sequence up at every step would tax plain decoding
        for nothing. They are all fed
        together once any sequence owes spec.defer_limit entries, which bounds the held features."""
        states = [self.state(work) for work in works]
        flush = any(state.num_pending >= self.spec.defer_limit for state in states)
        seqs, features, owners = [], [], []
        for work, state in zip(works, states):
            if state.num_pending == 0 or (not work.drafts_with_head and not flush):
                continue
            start, count = state.draft_len, state.num_pending
            tokens = token_range(work.prompt_token_ids, work.output_token_ids, start + 1, start + count + 1)
            seqs.append(SeqInput(torch.tensor(tokens, dtype=torch.long), start, work.block_table))
            features.append(state.pending)
            owners.append(work.request_id)
            state.draft_len, state.pending = start + count, None
        if not seqs:
            return {}
        hidden, offsets = self._forward(seqs, torch.cat(features))  # [T, hidden]
        return {
            request_id: hidden[offset + len(seq.token_ids) - 1]
            for request_id, seq, offset in zip(owners, seqs, offsets)
        }

    # ---- phase 2 ----------------------------------------------------------------------------

    @torch.inference_mode()
    def build_trees(
        self,
        works: list[SeqWork],
        root_hidden: torch.Tensor,  # [B, hidden] catch-up output at each root
    ) -> list[DraftTree]:
        """One tree per work, drafted with depth - 1 forwards: num_draft_tokens nodes, fewer when
        the work reserved fewer slots (its slots past num_draft_tokens - 1 are context lookup's)."""
        top_k, batch = self.spec.top_k, len(works)
        pool = CandidatePool()
        logprobs = self._logprobs(root_hidden[:, None, :])  # [B, 1, V]
        expansion = self._expand(torch.zeros(batch, 1, device=self.device), logprobs, top_k)
        pool.add(expansion)
        parent_hidden = root_hidden[:, None, :].expand(batch, top_k, -1)  # [B, K, hidden]
        for level in range(1, self.spec.depth):
            tokens = expansion.frontier_token_ids()  # [B, K]
            if level > 1:
                parent_idx = expansion.frontier_parent_idx()  # [B, K]
                parent_hidden = parent_hidden.gather(
                    1, parent_idx[:, :, None].expand(-1, -1, parent_hidden.shape[2])
                )
            seqs = [
                self._tree_level_input(work, b, level, tokens[b], pool.frontier_lineage[b])
                for b, work in enumerate(works)
            ]
            hidden, _ = self._forward(seqs, parent_hidden.reshape(batch * top_k, -1))
            parent_hidden = hidden.view(batch, top_k, -1)  # [B, K, hidden]
            expansion = self._expand(
                expansion.frontier_scores(), self._logprobs(parent_hidden), top_k
            )
            pool.add(expansion)

        roots = torch.tensor([w.token_ids[-1] for w in works], device=self.device)
        trees: dict[int, DraftTree] = {}
        sizes = [min(w.num_draft_slots, self.spec.num_draft_tokens - 1) + 1 for w in works]
        for num_nodes in set(sizes):
            trees[num_nodes] = pool.select(roots, num_nodes)
        return [_row(trees[num_nodes], b) for b, num_nodes in enumerate(sizes)]

    def _tree_level_input(
        self, work: SeqWork, row: int, level: int, tokens: torch.Tensor, lineage: torch.Tensor
    ) -> SeqInput:
        """Frontier nodes of depth `level` (tokens [K]) as draft entries after the context.

        Entry j of level m sits at position context + (m-1)*K + j and reads (node token, its
        parent's draft output); it sees the context and its own ancestors' entries.
        lineage: [K, level-1], each frontier node's index in the earlier frontiers."""
        top_k = self.spec.top_k
        context = work.start_pos  # the root's position: the draft KV holds 0..context-1
        width = level * top_k
        tail = torch.zeros(top_k, width, dtype=torch.bool)
        own = torch.arange(top_k)
        tail[own, (level - 1) * top_k + own] = True
        for earlier in range(level - 1):
            tail[own, earlier * top_k + lineage[:, earlier].cpu()] = True
        scratch = [
            self.scratch_start + row * self.scratch_blocks + i for i in range(self.scratch_blocks)
        ]
        return SeqInput(
            token_ids=tokens,
            start_pos=context + (level - 1) * top_k,
            block_table=work.block_table + scratch,
            rope_positions=torch.full((top_k,), context + level - 1, dtype=torch.long),
            committed_len=context,
            tail_mask=tail,
        )

    # ---- helpers ------------------------------------------------------------------------

    def _forward(
        self, seqs: list[SeqInput], features: torch.Tensor
    ) -> tuple[torch.Tensor, list[int]]:
        """One packed draft forward; features [T, feature] in packing order -> ([T, hidden], offsets)."""
        inputs = build_inputs(seqs, self.block_size, self.device)
        hidden = self.head(
            inputs.input_ids,
            features.unsqueeze(0),
            inputs.position_ids,
            eagle_meta=inputs.meta,
            eagle_kv=self.kv,
        )
        return hidden[0], inputs.offsets

    def _logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, K, hidden] -> [B, K, draft_vocab] float32 log-probabilities."""
        return torch.log_softmax(self.head.logits(hidden).float(), dim=-1)

    def _expand(self, scores: torch.Tensor, logprobs: torch.Tensor, top_k: int):
        expansion = expand_frontier(scores, logprobs, top_k)
        # Draft ids -> target ids (identity for EAGLE-1/2): verification compares target ids,
        # and the next level embeds them with the target's embedding.
        return expansion._replace(
            cand_token_ids=self.head.draft_to_target(expansion.cand_token_ids)
        )


def _row(tree: DraftTree, b: int) -> DraftTree:
    return DraftTree(
        tree.token_ids[b : b + 1],
        tree.parents[b : b + 1],
        tree.depths[b : b + 1],
        tree.ancestor_mask[b : b + 1],
    )
