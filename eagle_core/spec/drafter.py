"""Batched EAGLE-2 drafting with the draft head's own paged KV.

Alignment: the draft head's entry at position p reads (token p+1, target feature f_p) and
predicts f_{p+1}, whose logits propose token p+2. Its KV lives in a separate `KVStorage`
(a layer per head layer) addressed by the SAME block tables as the target's, so the scheduler's
blocks cover both. A step drafts in two phases, before the target forward:

1. catch-up: every sequence that drafts this step feeds the entries it owes (positions whose
   target features arrived in earlier steps: a prefill chunk, or the root plus accepted tokens),
   all packed into one draft forward. Sequences that do not draft are never fed: they keep
   only their most recent features (`DraftState`), and when one drafts again after owing more
   than that window, its draft context restarts at the window (see `catch_up`). The last entry
   of a decoding sequence reads the root (the last sampled token) and gives the root's
   children.
2. tree levels: depth - 1 more forwards (fewer when the step's trees are too small to reach
   that deep) over the top_k frontier nodes of every speculating sequence. These entries are
   provisional: they sit at positions past the sequence's context (in its reserved blocks,
   then in per-row scratch blocks beyond the shared pool) and are overwritten by the next
   step's catch-up, so the draft KV keeps committed tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from eagle_core.batch import SeqWork, token_range
from eagle_core.config import SpecConfig
from eagle_core.kv import blocks_needed
from eagle_core.spec.tree import CandidatePool, DraftTree, expand_top
from eagle_core.worker.attention import make_backend
from eagle_core.worker.compiled import (
    CompiledFunction,
    CompileSettings,
    mark_dynamic,
    mark_dynamic_rows,
)
from eagle_core.worker.inputs import SeqGroup, block_table_tensor, causal_group
from eagle_core.worker.kv_storage import KVStorage
from eagle_core.worker.model_runner import kv_shape, pad_rows
from eagle_core.worker.warm_up import dummy_groups


@dataclass
class DraftState:
    """Per-request drafting state.

    The draft head's context is positions origin .. draft_len - 1 (committed draft KV; origin is
    a block boundary, and the head attends to nothing before it). `pending` holds the target
    features of positions pending_start .. pending_start + num_pending - 1, which at a step's
    start end at the target's KV length. pending_start == draft_len unless the sequence went
    without drafting long enough for old features to be dropped (a gap)."""

    num_preemptions: int = 0
    """The sequence's SeqWork.num_preemptions when this state began."""
    origin: int = 0
    draft_len: int = 0
    pending_start: int = 0
    pending: list[torch.Tensor] = field(default_factory=list)
    """[c_i, feature] chunks, one per step that committed tokens, concatenated only when fed."""
    num_pending: int = 0
    """Rows in `pending`."""

    def keep_last(self, window: int, block_size: int) -> None:
        """Drop the oldest pending features once window + block_size are held, keeping between
        `window` and window + block_size - 1 from a block boundary (pending_start stays one)."""
        if self.num_pending < window + block_size:
            return
        end = self.pending_start + self.num_pending
        drop = (end - window) // block_size * block_size - self.pending_start
        kept, seen = [], 0
        for chunk in self.pending:
            if seen + chunk.shape[0] > drop:
                kept.append(chunk[max(drop - seen, 0) :])
            seen += chunk.shape[0]
        self.pending, self.pending_start, self.num_pending = kept, self.pending_start + drop, self.num_pending - drop


class RootDraft(NamedTuple):
    """A fed sequence's last draft entry: the head's output and its best next tokens."""

    hidden: torch.Tensor  # [hidden]
    top_logprobs: torch.Tensor  # [top_k] float32
    top_ids: torch.Tensor  # [top_k] long target ids


@dataclass
class DraftOutput:
    hidden: torch.Tensor  # [T, hidden] the head's output at every real token
    top_logprobs: torch.Tensor  # [R, top_k] float32 best log-probabilities at the requested rows
    top_ids: torch.Tensor  # [R, top_k] long, their target token ids


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
        attention_backend: str = "gather",
        compile: CompileSettings | None = None,
    ):
        """`compile`: run the head's forward through CompiledFunction with these settings
        (None: eagerly)."""
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
        self.compiled = compile is not None
        self.shape_buckets = self.compiled and compile.shape_buckets(device)
        self.backend = make_backend(attention_backend, block_size, self.kv, self.shape_buckets)
        self._run = (
            CompiledFunction(self._forward_fn, device, compile, static_inputs=(self.kv.kv,))
            if self.compiled
            else self._forward_fn
        )
        self.states: dict[str, DraftState] = {}
        self.committed: dict[int, tuple[bytes, int]] = {}
        """Pool block -> (its prefix-cache key, the token after it), for blocks whose every draft
        entry a sequence with that prefix committed. An entry at position p reads token p + 1 and
        the target's feature at p, so a later sequence whose block has the same key and the same
        next token would compute the same entries: it attends to these instead (see state)."""

    # ---- state --------------------------------------------------------------------------

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.states.pop(request_id, None)

    def state(self, work: SeqWork) -> DraftState:
        """The request's state, reset when its target KV was recomputed (preemption: the draft
        KV in its blocks may be another sequence's or none). A new state's draft context ends
        where the work starts: position 0, or the block boundary up to which a prefix-cache hit
        supplied the target's KV. Its context then begins at the first of the hit's last blocks
        whose draft entries were all committed (`committed`), or at the boundary itself when
        the last one's were not (the head then attends to none of the cached tokens, as after a
        feature-window gap; see catch_up)."""
        state = self.states.get(work.request_id)
        if (
            state is None
            or state.num_preemptions != work.num_preemptions
            or state.pending_start + state.num_pending != work.start_pos
        ):
            start = work.start_pos
            assert start % self.block_size == 0, "a draft context starts at a block boundary"
            block = start // self.block_size
            while block > 0 and (content := self._content(work, block - 1)) is not None:
                if not self.resumes(work.block_table[block - 1], *content):
                    break
                block -= 1
            state = DraftState(work.num_preemptions, origin=block * self.block_size, draft_len=start, pending_start=start)
            self.states[work.request_id] = state
        return state

    def resumes(self, block: int, key: bytes, next_token: int) -> bool:
        """Whether `block`'s draft entries were committed in full for content `key` followed by
        `next_token`: a sequence with that content and next token can take them over (`state`)."""
        return self.committed.get(block) == (key, next_token)

    def track(self, works: list[SeqWork]) -> None:
        """Make sure every work's request has a valid state (`state`) before its features are
        recorded, in a step that feeds nobody."""
        for work in works:
            self.state(work)

    def record(self, request_id: str, features: torch.Tensor) -> None:
        """Features ([c, feature]) of the tokens the target just committed, owed to the draft.
        Held until fed: `features` should not view a tensor much larger than the rows it holds."""
        state = self.states[request_id]
        state.pending.append(features)
        state.num_pending += features.shape[0]
        state.keep_last(self.spec.feature_window, self.block_size)

    # ---- phase 1 ----------------------------------------------------------------------------

    def catch_up(self, works: list[SeqWork]) -> dict[str, RootDraft]:
        """Feed the owed entries of the works that draft with the head this step, in one packed
        forward; returns, per request fed, its last entry's output and candidates.

        The others (plain or lookup-only decoding, prefill chunks) are not fed: a sequence that
        does not draft costs no draft forward. A sequence whose oldest features were dropped
        (`DraftState.keep_last`) restarts its draft context where its features begin: the head
        then sees the last spec.feature_window or so tokens instead of the whole context, which
        changes what it proposes, never what is accepted."""
        groups, features, owners = [], [], []
        for work in works:
            state = self.state(work)
            if not work.drafts_with_head:
                continue
            if state.pending_start != state.draft_len:
                state.origin = state.draft_len = state.pending_start
            # This step writes draft entries from draft_len on (context, then tree levels).
            for block in work.block_table[state.draft_len // self.block_size :]:
                self.committed.pop(block, None)
            if state.num_pending == 0:
                continue
            start, count = state.draft_len, state.num_pending
            tokens = token_range(work.prompt_token_ids, work.output_token_ids, start + 1, start + count + 1)
            groups.append(self._context_group(state, work.block_table, tokens))
            features += state.pending
            owners.append(work.request_id)
            state.draft_len, state.pending_start, state.pending, state.num_pending = start + count, start + count, [], 0
            first_whole = -(-state.origin // self.block_size)
            for block in range(max(first_whole, start // self.block_size), min(state.draft_len // self.block_size,
                                                                                len(work.cache_keys))):
                self.committed[work.block_table[block]] = self._content(work, block)
        if not groups:
            return {}
        last_rows, total = [], 0
        for group in groups:
            total += group.num_tokens
            last_rows.append(total - 1)
        out = self.forward(groups, torch.cat(features), torch.tensor(last_rows))
        return {
            request_id: RootDraft(out.hidden[row], out.top_logprobs[i], out.top_ids[i])
            for i, (request_id, row) in enumerate(zip(owners, last_rows))
        }

    def _content(self, work: SeqWork, block: int) -> tuple[bytes, int] | None:
        """(prefix-cache key, next token) of the work's `block`-th block, None when unhashed."""
        if block >= len(work.cache_keys):
            return None
        after = (block + 1) * self.block_size
        return work.cache_keys[block], token_range(work.prompt_token_ids, work.output_token_ids, after, after + 1)[0]

    def _context_group(self, state: DraftState, block_table: list[int], tokens: list[int]) -> SeqGroup:
        """The entries draft_len .. draft_len + len(tokens) - 1 as one causal row of the head's
        context: stored and masked relative to the origin (the block table starts at the
        origin's block), rotated at their true positions."""
        start = state.draft_len - state.origin
        group = causal_group([tokens], [start], [block_table[state.origin // self.block_size :]], self.block_size)
        group.positions = state.draft_len + torch.arange(len(tokens))[None, :]  # [1, Q]
        return group

    # ---- phase 2 ----------------------------------------------------------------------------

    def build_trees(
        self,
        works: list[SeqWork],
        root_hidden: torch.Tensor,  # [B, hidden] catch-up output at each root
        root_top: tuple[torch.Tensor, torch.Tensor],  # [B, top_k] log-probabilities and ids at each root
    ) -> list[DraftTree]:
        """One tree per work of `num_tree_slots + 1` nodes (at most num_draft_tokens), drafted
        with the forwards those sizes can use: a tree of n nodes reaches depth n - 1 at most,
        so levels past the largest tree's n - 1 (and past `depth`) are not drafted."""
        top_k, batch = self.spec.top_k, len(works)
        sizes = [min(w.num_tree_slots, self.spec.num_draft_tokens - 1) + 1 for w in works]
        pool = CandidatePool()
        top_values, top_ids = root_top
        expansion = expand_top(torch.zeros(batch, 1, device=self.device), top_values[:, None], top_ids[:, None], top_k)
        pool.add(expansion)
        parent_hidden = root_hidden[:, None, :].expand(batch, top_k, -1)  # [B, K, hidden]
        origins = torch.tensor([self.states[w.request_id].origin for w in works])  # [B]
        roots_at = torch.tensor([w.start_pos for w in works])  # [B] each root's position
        tables = self._tables_with_scratch(works)  # [B, MB], from each origin's block
        for level in range(1, min(self.spec.depth, max(sizes) - 1)):
            if level > 1:
                parent_idx = expansion.frontier_parent_idx()  # [B, K]
                parent_hidden = parent_hidden.gather(
                    1, parent_idx[:, :, None].expand(-1, -1, parent_hidden.shape[2])
                )
            group = self._tree_level_group(
                roots_at - origins, roots_at, tables, level, expansion.frontier_token_ids(), pool.frontier_lineage
            )
            rows = torch.arange(batch * top_k)
            out = self.forward([group], parent_hidden.reshape(batch * top_k, -1), rows)
            parent_hidden = out.hidden.view(batch, top_k, -1)  # [B, K, hidden]
            expansion = expand_top(
                expansion.frontier_scores(),
                out.top_logprobs.view(batch, top_k, top_k),
                out.top_ids.view(batch, top_k, top_k),
                top_k,
            )
            pool.add(expansion)

        roots = torch.tensor([w.token_ids[-1] for w in works], device=self.device)
        trees: dict[int, DraftTree] = {}
        for num_nodes in set(sizes):
            trees[num_nodes] = pool.select(roots, num_nodes)
        return [_row(trees[num_nodes], b) for b, num_nodes in enumerate(sizes)]

    def _tables_with_scratch(self, works: list[SeqWork]) -> torch.Tensor:
        """[B, MB] block tables from each sequence's origin block, continued with its scratch
        blocks: tree-level entries past a sequence's reserved slots land there."""
        rows = []
        for row, work in enumerate(works):
            first = self.scratch_start + row * self.scratch_blocks
            own = work.block_table[self.states[work.request_id].origin // self.block_size :]
            rows.append(own + list(range(first, first + self.scratch_blocks)))
        return block_table_tensor(rows)

    def _tree_level_group(
        self,
        context: torch.Tensor,  # [B] the roots' positions past their origins (the head's context length)
        roots_at: torch.Tensor,  # [B] the roots' positions
        tables: torch.Tensor,  # [B, MB] from the origins, with scratch blocks
        level: int,
        tokens: torch.Tensor,  # [B, K] frontier tokens of depth `level`
        lineage: torch.Tensor,  # [B, K, level-1] each frontier node's index in the earlier frontiers
    ) -> SeqGroup:
        """Frontier nodes of depth `level` as draft entries after the context.

        Entry j of level m is stored at context + (m-1)*K + j past the origin, rotated at
        roots_at + m, and reads (node token, its parent's draft output); it sees the context and
        its own ancestors' entries."""
        batch, top_k = tokens.shape
        device = tokens.device
        width = level * top_k
        own = torch.arange(top_k, device=device)
        tail = torch.zeros(batch, top_k, width, dtype=torch.bool, device=device)
        tail[:, own, (level - 1) * top_k + own] = True
        if level > 1:
            ancestors = lineage + torch.arange(level - 1, device=device) * top_k  # [B, K, level-1]
            tail.scatter_(2, ancestors, True)
        start = context + (level - 1) * top_k
        return SeqGroup(
            token_ids=tokens,
            start_pos=start,
            block_tables=tables,
            key_len=int(start.max()) + top_k,
            positions=(roots_at + level - 1)[:, None].expand(batch, top_k).to(device),
            committed_len=context,
            tail_mask=tail,
        )

    # ---- the head's forward -------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, groups: list[SeqGroup], features: torch.Tensor, rows: torch.Tensor) -> DraftOutput:
        """One packed draft forward; features [T, feature] in packing order; candidates at
        `rows` ([R] indices into the packed row, on the host)."""
        batch = self.backend.prepare(groups)
        num_rows = rows.shape[0]
        num_pad = batch.input_ids.shape[0] - features.shape[0]
        features = torch.cat([features, features.new_zeros(num_pad, features.shape[1])])  # new, see pad_rows
        rows = pad_rows(rows, self.compiled, self.shape_buckets).to(self.device)
        if self.compiled and self._run.guarded:  # only a compiling call needs the marks
            mark_dynamic(batch.input_ids, batch.positions, rows, *batch.meta.dynamic_tensors())
            mark_dynamic_rows(features)
        hidden, top_values, top_ids = self._run(batch.input_ids, batch.positions, batch.meta, self.kv.kv, features, rows)
        return DraftOutput(hidden[: batch.num_tokens], top_values[:num_rows], top_ids[:num_rows])

    def warm_up(self) -> None:
        """Build the compiled graphs (worker/warm_up.py): one for target features (catch-up),
        one for the head's own outputs (tree levels) where their widths differ (EAGLE-3)."""
        groups = dummy_groups(self.block_size, tree=True)
        num_tokens = sum(g.num_tokens for g in groups)
        for width in dict.fromkeys([self.head.feature_size, self.head.hidden_size]):
            features = torch.zeros(num_tokens, width, dtype=self.kv.kv.dtype, device=self.device)
            self.forward(groups, features, torch.tensor([0, 1, 2]))
        self._run.warmed_up()

    def _forward_fn(self, input_ids, positions, meta, kv_tensor, features, rows):
        """[T] ids and positions, metadata, the KV tensor, [T, feature], [R] rows ->
        ([T, hidden], [R, top_k] log-probabilities, [R, top_k] target ids)."""
        if hasattr(meta, "derive"):
            meta = meta.derive()
        hidden = self.head(input_ids[None], features[None], positions[None], eagle_meta=meta, eagle_kv=kv_tensor)[0]
        logprobs = torch.log_softmax(self.head.logits(hidden[rows]).float(), dim=-1)  # [R, draft_vocab]
        top = torch.topk(logprobs, self.spec.top_k, dim=-1)
        # Draft ids -> target ids (identity for EAGLE-1/2): verification compares target ids,
        # and the next level embeds them with the target's embedding.
        return hidden, top.values, self.head.draft_to_target(top.indices)


def _row(tree: DraftTree, b: int) -> DraftTree:
    return DraftTree(
        tree.token_ids[b : b + 1],
        tree.parents[b : b + 1],
        tree.depths[b : b + 1],
        tree.ancestor_mask[b : b + 1],
        tree.ranks[b : b + 1] if tree.ranks is not None else None,
    )
