"""Continuous-batching scheduler: pure Python bookkeeping, no tensors.

Each step it decides which sequences run and how many tokens each computes, under two budgets:
tokens per step (`max_num_batched_tokens`, draft-tree tokens included) and KV blocks. Policy:

1. Running sequences first, oldest first. A decoding sequence computes its one last token; a
   sequence still prefilling computes its next chunk. When KV blocks run out, the newest
   running sequence is preempted: its blocks are freed and it goes back to the front of the
   waiting queue, to be recomputed later (prompt + output so far are simply prefilled again).
2. Then, if nothing was preempted, waiting requests are admitted first-come-first-served while
   sequence slots, tokens and blocks remain. Long prompts are split into chunks.
3. Then the draft head's trees, from the tokens and blocks left, oldest sequence first: each
   decoding sequence the speculation policy chose gets up to its tree's size in slots past its
   root (at most `num_draft_slots`, spec/policy.py; or, pinned by --spec-max-batch, a
   full-size tree while at most `max_spec_batch` sequences run). Drafts never take a prompt's
   tokens or blocks, nor preempt anything.
4. Tokens still left go to context lookup: each decoding sequence, oldest first, gets up to
   `num_lookup_slots` more draft slots (without a head tree only where the policy allows a
   chain alone, or, pinned, up to `max_lookup_batch` running sequences). Lookup finds a chain
   for only about a third of steps, so its slots come last and never crowd out a prefill; they
   use free KV blocks or room in the sequence's own blocks, never preempting for them.

Every decoding sequence of a step is part of the same worker call, i.e. one target forward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from eagle_core.batch import ScheduledBatch, SeqWork, StepResult
from eagle_core.config import SchedulerConfig
from eagle_core.kv import BlockManager, blocks_needed
from eagle_core.request import Request, RequestStatus
from eagle_core.spec.policy import Candidate, Choice, SpeculationPolicy


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        block_manager: BlockManager,
        num_draft_slots: int = 0,
        max_spec_batch: int = 0,
        num_lookup_slots: int = 0,
        max_lookup_batch: int = 0,
        policy: SpeculationPolicy | None = None,
        draft_resumes: Callable[[int, bytes, int], bool] | None = None,
    ):
        self.config = config
        self.blocks = block_manager
        self.num_draft_slots = num_draft_slots
        """Most draft head tree tokens per decoding sequence per step (tree size minus its root)."""
        self.num_lookup_slots = num_lookup_slots
        """Most context-lookup tokens per decoding sequence per step, from leftover budget."""
        self.max_lookup_batch = max_lookup_batch
        """Pinned lookup rule: decode steps without a head tree get lookup slots (lookup alone
        drafts) only while at most this many sequences run (0: any number)."""
        self.max_spec_batch = max_spec_batch
        """Without a policy: above this many running sequences a step decodes without trees (0:
        no limit)."""
        self.policy = policy
        """Chooses each step which decoding sequences draft (then max_spec_batch is unused), and
        which may verify a lookup chain alone unless the policy leaves that to max_lookup_batch."""
        self.draft_resumes = draft_resumes
        """(cached block, its key, the token after it) -> whether the draft head's entries in that
        block are those of a sequence with this content (Drafter.resumes): a request starting
        past the block can take them over. None without a draft head."""
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        self.num_preemptions = 0
        self.num_queried_tokens = 0
        """Prompt tokens of admitted requests (first admissions), looked up in the prefix cache."""
        self.num_cached_tokens = 0
        """Of those, tokens whose KV came from the cache."""

    # ---- queue management -------------------------------------------------------------

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish(self, request_id: str, reason: str) -> Request | None:
        """Finish (or abort) a request wherever it is and free its KV. Idempotent."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        self.blocks.free(request.block_table)
        if self.policy is not None:
            self.policy.drop(request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self._finished_ids.append(request_id)
        return request

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ---------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        work: list[SeqWork] = []
        preempted = False
        choice = self._choose(budget)
        speculate = not self.max_spec_batch or len(self.running) <= self.max_spec_batch
        tree_slots = choice.tree_nodes - 1 if choice and choice.tree_nodes else self.num_draft_slots

        wanted_drafts: list[tuple[SeqWork, int]] = []
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            drafts = request.request_id in choice.head if choice else speculate
            num_new, num_draft, skip_reason = self._plan(request, budget, tree_slots if drafts else 0)
            if num_new == 0:
                continue
            if not self._reserve(request, num_new):
                preempted = True
                continue
            work.append(self._work(request, num_new, skip_reason))
            wanted_drafts.append((work[-1], num_draft))
            budget -= num_new

        while (
            not preempted
            and self.waiting
            and budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting[0]
            hits = self._cache_hits(request)
            cached = len(hits) * self.blocks.block_size
            num_new = min(request.num_tokens - cached, budget)
            needed = blocks_needed(cached + num_new, self.blocks.block_size) - len(hits)
            if needed > self.blocks.num_free_after(hits):
                break  # FCFS: never let a later request overtake the head of the queue
            self.waiting.popleft()
            self.blocks.share(request.block_table, hits)
            request.num_computed_tokens = cached
            request.num_keyed_blocks = len(hits)
            if not request.num_preemptions:
                request.num_cached_tokens = cached
                self.num_cached_tokens += cached
                self.num_queried_tokens += request.num_prompt_tokens
            if self.policy is not None:
                self.policy.admit(request.request_id, cached)
            self.blocks.grow(request.block_table, cached + num_new)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            # A readmission whose cached blocks leave only its last token is a decode step; the
            # policy did not weigh it, so it gets no head tree (lookup as for plain decoding).
            work.append(self._work(request, num_new))
            if work[-1].is_decode:
                work[-1].draft_skip_reason = "policy" if self.policy else "batch_size"
            budget -= num_new

        # Draft slots last, from the tokens and KV blocks the running sequences' own tokens and
        # the admitted prompts left: drafts are optional. A prompt's tokens are work a step
        # does either way, and a tree that took their budget would push them into an extra
        # step; a block another sequence then lacks would preempt it (its whole context
        # recomputed) for a few draft tokens.
        for w, num_draft in wanted_drafts:
            if num_draft:
                request = self.requests[w.request_id]
                reserved = w.start_pos + len(w.token_ids)
                w.num_draft_slots = self._grow_without_preempting(request, reserved, min(num_draft, budget))
                w.num_tree_slots = w.num_draft_slots
                if not w.num_draft_slots:
                    w.draft_skip_reason = "token_budget" if budget < 1 else "kv_cache"
                budget -= w.num_draft_slots

        if self.num_lookup_slots and budget > 0:
            if choice and self.policy.decides_lookup:
                lookup_alone = choice.lookup_alone
            elif not self.max_lookup_batch or len(self.running) <= self.max_lookup_batch:
                lookup_alone = frozenset(w.request_id for w in work)
            else:
                lookup_alone = frozenset()
            self._add_lookup_slots(work, budget, lookup_alone)
        finished, self._finished_ids = self._finished_ids, []
        return ScheduledBatch(seqs=work, finished_request_ids=finished)

    def _choose(self, budget: int) -> Choice | None:
        """The policy's choice for this step's decoding sequences (None without a policy)."""
        if self.policy is None or not self.num_draft_slots:
            return None
        candidates, other_rows = [], 0
        for request in self.running:
            if _prefilling(request):
                other_rows += min(request.num_tokens - request.num_computed_tokens, budget)
            else:
                room = _draft_room(request) >= 1
                candidates.append(
                    Candidate(request.request_id, request.params.greedy, head=room, context_len=request.num_computed_tokens)
                )
        # Waiting requests this step is likely to admit (KV blocks aside) prefill in it too.
        left = budget - len(candidates) - other_rows
        seats = self.config.max_num_seqs - len(self.running)
        for request in self.waiting:
            if left <= 0 or seats <= 0:
                break
            chunk = min(request.num_tokens - request.num_computed_tokens, left)
            other_rows += chunk
            left -= chunk
            seats -= 1
        return self.policy.choose(candidates, other_rows)

    def _cache_hits(self, request: Request) -> list[int]:
        """The cached blocks `request` (holding no blocks) can start from: the longest run of its
        leading full blocks found in the prefix cache, short of its last token, which is always
        computed (its logits give the next token).

        With a draft head, one block less where that block is what keeps the head from its cached
        context: the head's entries of a block end with the next block's first token, so a
        sequence can take over the hit's draft entries only up to a block whose entries were
        committed with its own next token (Drafter.state). Where the last hit block's were not,
        computing that block again gives the head the target's features there, so that it
        resumes from the block before, if that one's entries are the request's own (a
        conversation whose previous turn ended before the head was fed its last block), or from
        position 0 where the hit is that one block (a chat template's system prompt that no
        drafting sequence has fed the head yet: without its first tokens the head accepts less).
        Otherwise the hit is whole: either the head resumes past it, or it has no cached context
        to resume, and computing the block again would buy it one block's context for a prefill
        of as many tokens (with a shared system prompt, in every request)."""
        usable = (request.num_tokens - 1) // self.blocks.block_size
        if not self.blocks.caching or usable == 0:
            return []
        keys = request.block_keys(usable, self.blocks.block_size)
        hits = self.blocks.match(keys)
        if self.draft_resumes is not None and hits and not self._draft_resumes(request, hits, keys, len(hits) - 1):
            if len(hits) == 1 or self._draft_resumes(request, hits, keys, len(hits) - 2):
                return hits[:-1]
        return hits

    def _draft_resumes(self, request: Request, hits: list[int], keys: list[bytes], index: int) -> bool:
        """Whether the draft entries of hit block `index` are `request`'s own (draft_resumes)."""
        after = (index + 1) * self.blocks.block_size
        return self.draft_resumes(hits[index], keys[index], request.token_slice(after, after + 1)[0])

    def _add_lookup_slots(self, work: list[SeqWork], budget: int, lookup_alone: frozenset[str]) -> None:
        """Give decode steps context-lookup slots from the `budget` tokens nothing else took;
        steps without a head tree only for the requests in `lookup_alone`."""
        for w in work:
            if budget < 1:
                return
            if not w.is_decode or w.draft_skip_reason not in (None, "batch_size", "policy"):
                continue  # prefill chunks, and steps with no room or budget for any draft
            if w.draft_skip_reason is not None and w.request_id not in lookup_alone:
                continue
            request = self.requests[w.request_id]
            room = _draft_room(request) - w.num_draft_slots
            reserved = w.start_pos + 1 + w.num_draft_slots
            extra = self._grow_without_preempting(request, reserved, min(self.num_lookup_slots, budget, room))
            w.num_draft_slots += extra
            budget -= extra

    def _grow_without_preempting(self, request: Request, reserved: int, wanted: int) -> int:
        """Grow `request`'s blocks for up to `wanted` draft slots past its first `reserved`
        tokens, from the blocks it holds and the free ones; returns how many it got."""
        reachable = (len(request.block_table) + self.blocks.num_free_blocks) * self.blocks.block_size
        wanted = min(wanted, reachable - reserved)
        if wanted < 1:
            return 0
        self.blocks.grow(request.block_table, reserved + wanted)
        return wanted

    def _plan(self, request: Request, budget: int, tree_slots: int) -> tuple[int, int, str | None]:
        """(tokens to compute, draft slots, why a decode step gets no draft slots) for this
        request within `budget` tokens, drafting a tree of up to `tree_slots` tokens past its
        root (0: none)."""
        if _prefilling(request):
            return min(request.num_tokens - request.num_computed_tokens, budget), 0, None
        if budget < 1:
            return 0, 0, None
        if not self.num_draft_slots:
            return 1, 0, None
        room = _draft_room(request)
        if room < 1:
            return 1, 0, "length_cap"
        if budget < 2:
            return 1, 0, "token_budget"
        if not tree_slots:
            return 1, 0, "policy" if self.policy else "batch_size"
        return 1, min(tree_slots, budget - 1, room), None

    def _reserve(self, request: Request, num_tokens: int) -> bool:
        """Grow `request`'s blocks for num_tokens more tokens, preempting newer requests as needed.

        Returns False when `request` itself had to be preempted.
        """
        target = request.num_computed_tokens + num_tokens
        while not self.blocks.can_grow(request.block_table, target):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is request:
                return False
        self.blocks.grow(request.block_table, target)
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.blocks.free(request.block_table)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _work(self, request: Request, num_new: int, skip_reason: str | None = None) -> SeqWork:
        """The step's work for `request`; draft slots are granted afterwards."""
        start = request.num_computed_tokens
        return SeqWork(
            request_id=request.request_id,
            token_ids=request.token_slice(start, start + num_new),
            start_pos=start,
            block_table=request.block_table,
            sample=start + num_new == request.num_tokens,
            num_draft_slots=0,
            params=request.params,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            max_new_tokens=request.max_output_tokens - request.num_output_tokens,
            stop_token_ids=request.stop_token_ids,
            cache_keys=request.cache_keys,
            num_preemptions=request.num_preemptions,
            draft_skip_reason=skip_reason,
        )

    # ---- applying a step's results ------------------------------------------------------

    def update(self, batch: ScheduledBatch, result: StepResult) -> list[tuple[Request, list[int]]]:
        """Apply the worker's result. Returns (request, tokens appended this step) for every
        request that sampled, including requests this step finished (status FINISHED)."""
        news: list[tuple[Request, list[int]]] = []
        for work in batch.seqs:
            request = self.requests.get(work.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            request.num_computed_tokens += len(work.token_ids)
            seq_result = result.results.get(work.request_id)
            if seq_result is None:
                self._register_computed(request)
                continue
            # Accepted drafts' KV was kept (compacted after token_ids); the bonus token's was not.
            request.num_computed_tokens += seq_result.num_accepted_tokens
            appended, reason = self._append(request, seq_result.new_token_ids)
            self._register_computed(request)
            if reason is not None:
                self.finish(request.request_id, reason)
            news.append((request, appended))
        return news

    def _register_computed(self, request: Request) -> None:
        """Offer the request's newly full and computed blocks to the prefix cache (a stop token
        cut from the output may have KV computed; it is no block's content)."""
        full = min(request.num_computed_tokens, request.num_tokens) // self.blocks.block_size
        if self.blocks.caching and full > request.num_keyed_blocks:
            keys = request.block_keys(full, self.blocks.block_size)
            self.blocks.register(request.block_table, keys, request.num_keyed_blocks, full)
            request.num_keyed_blocks = full

    def _append(self, request: Request, token_ids: list[int]) -> tuple[list[int], str | None]:
        """Append tokens one by one, stopping at EOS, a stop id or the length cap.

        The stop token itself is not appended (its text is never shown)."""
        stop_token_ids = request.stop_token_ids
        appended: list[int] = []
        for token_id in token_ids:
            if token_id in stop_token_ids:
                return appended, "stop"
            request.output_token_ids.append(token_id)
            appended.append(token_id)
            if request.num_output_tokens >= request.max_output_tokens:
                return appended, "length"
        return appended, None


def _prefilling(request: Request) -> bool:
    """The request's next step computes prompt tokens: a new prompt (its last token too, see
    SeqWork.is_decode) or a recompute after preemption."""
    return request.num_tokens - request.num_computed_tokens > 1 or not request.output_token_ids


def _draft_room(request: Request) -> int:
    """Most draft tokens worth verifying this step. Drafting past the output cap is wasted work:
    at most max_output - output - 1 drafts can be accepted before the bonus token reaches it."""
    return request.max_output_tokens - request.num_output_tokens - 1
