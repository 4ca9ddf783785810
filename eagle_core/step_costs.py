"""Start-up measurement of what decode steps cost on this machine: the speculation policy's
first cost tables (spec/policy.py), which it then refines from served steps.

It runs the real path: a private Scheduler over the engine's (still empty) KV pool schedules
a few synthetic requests, and the worker executes their steps, alternating plain steps and
steps in which every sequence drafts the configured (full-size) tree, at batch sizes 1, 2, 4,
... up to max_num_seqs. Each batch size's first step of each kind is discarded (on a GPU it
records that shape's CUDA graph), the median of the rest kept. Plain steps give the plain
table (seconds by target rows); a drafting step's seconds less the plain table's price of the
rows it verified give the draft table (seconds by drafting sequences). At the largest size,
FEED_GAP plain steps then one drafting step price feeding the head what sequences owe after
not drafting (seconds per owed entry). The synthetic requests are finished and their worker
state dropped before the engine takes its first request.
"""

from __future__ import annotations

import logging
import statistics
import time

from eagle_core.batch import ScheduledBatch
from eagle_core.config import EngineConfig
from eagle_core.kv import BlockManager, blocks_needed
from eagle_core.request import Request
from eagle_core.sampling_params import SamplingParams
from eagle_core.scheduler import Scheduler
from eagle_core.spec.policy import Choice, StepCosts

logger = logging.getLogger(__name__)

PROMPT_TOKENS = 16
TIMED_STEPS = 3
"""Timed steps of each kind per batch size (after one discarded)."""
FEED_GAP = 32
"""Plain steps before the drafting step that prices feeding owed entries."""


class _Pinned:
    """A stand-in policy: every decoding sequence drafts, or none does."""

    decides_lookup = True

    def __init__(self):
        self.draft = False

    def choose(self, candidates, other_rows=0) -> Choice:
        head = frozenset(c.request_id for c in candidates if c.head) if self.draft else frozenset()
        return Choice(head, frozenset(), 0.0)

    def admit(self, request_id: str, start: int) -> None:
        pass

    def drop(self, request_id: str) -> None:
        pass


def batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... and max_num_seqs itself."""
    sizes = [1]
    while sizes[-1] * 2 < max_num_seqs:
        sizes.append(sizes[-1] * 2)
    if max_num_seqs > 1:
        sizes.append(max_num_seqs)
    return sizes


def measure_step_costs(worker, config: EngineConfig, blocks: BlockManager) -> StepCosts:
    """Median seconds of plain and all-drafting decode steps by batch size (see the module
    docstring). `blocks` must have no block in use."""
    tree_slots = worker.num_tree_slots
    pinned = _Pinned()
    scheduler = Scheduler(config.scheduler, blocks, num_draft_slots=tree_slots, policy=pinned)
    per_request = PROMPT_TOKENS + (2 * TIMED_STEPS + 3) * (tree_slots + 1) + tree_slots + FEED_GAP + 1
    vocab = worker.vocab_size
    plain: dict[int, float] = {}
    drafting: dict[int, tuple[float, int]] = {}  # batch size -> (seconds, rows verified)
    fed = (0.0, 0)
    start = time.perf_counter()
    sizes = [
        size for size in batch_sizes(config.scheduler.max_num_seqs)
        if size * blocks_needed(per_request, blocks.block_size) <= blocks.num_free_blocks  # the KV pool holds them
        and size * (tree_slots + 1) <= config.scheduler.max_num_batched_tokens
    ]
    for size in sizes:
        ids = [f"cost-{size}-{i}" for i in range(size)]
        params = SamplingParams(temperature=0, ignore_eos=True)
        for i, request_id in enumerate(ids):
            prompt = [(7 * (i + j) + 3) % vocab for j in range(PROMPT_TOKENS)]
            scheduler.add(Request(request_id, prompt, params, per_request - PROMPT_TOKENS))
        while any(not r.output_token_ids for r in scheduler.running) or scheduler.waiting:
            _step(worker, scheduler)  # prefill
        times: dict[bool, list[tuple[float, int]]] = {False: [], True: []}
        for _ in range(TIMED_STEPS + 1):
            for draft in (False, True):
                pinned.draft = draft
                times[draft].append(_step(worker, scheduler))
        plain[size] = statistics.median(seconds for seconds, _ in times[False][1:])
        drafting[size] = sorted(times[True][1:])[TIMED_STEPS // 2]  # the median step by seconds
        if size == sizes[-1]:
            pinned.draft = False
            for _ in range(FEED_GAP):
                _step(worker, scheduler)
            pinned.draft = True
            fed = _step(worker, scheduler)
        for request_id in ids:
            scheduler.finish(request_id, "abort")
        worker.execute(ScheduledBatch(seqs=[], finished_request_ids=scheduler.schedule().finished_request_ids))
    costs = StepCosts(plain, {1: 0.0}, depth=config.spec.depth)
    draft = {size: max(seconds - costs.plain(rows), 1e-6) for size, (seconds, rows) in drafting.items()}
    costs = StepCosts(plain, draft, depth=config.spec.depth)
    if sizes:
        size = sizes[-1]
        seconds, rows = fed
        costs.feed = max(seconds - costs.step(rows, size), 0.0) / (size * FEED_GAP)
    logger.info(
        "step costs measured in %.1f s: plain %s (ms by target rows), drafting adds %s (ms by "
        "drafting sequences); feeding the head %.3f ms per owed entry",
        time.perf_counter() - start, _ms(costs.plain.as_dict()), _ms(costs.draft.as_dict()), 1e3 * costs.feed,
    )
    return costs


def _step(worker, scheduler: Scheduler) -> tuple[float, int]:
    """(seconds, target rows) of the next step."""
    batch = scheduler.schedule()
    start = time.perf_counter()
    result = worker.execute(batch)
    seconds = time.perf_counter() - start
    scheduler.update(batch, result)
    rows = sum(
        len(w.token_ids) + (result.results[w.request_id].num_draft_tokens if w.request_id in result.results else 0)
        for w in batch.seqs
    )
    return seconds, rows


def _ms(table: dict[int, float]) -> str:
    return ", ".join(f"{size}: {1e3 * seconds:.1f}" for size, seconds in table.items())
