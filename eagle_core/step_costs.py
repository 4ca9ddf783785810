"""Start-up measurement of what decode steps cost on this machine: the speculation policy's
first cost tables (spec/policy.py), which it then refines from served steps.

It runs the real path: a private Scheduler over the engine's (still empty) KV pool schedules
a few synthetic requests, and the worker executes their steps at batch sizes 1, 2, 4, ... up to
max_num_seqs, in rounds of one step of each kind: plain (nobody drafts), then every sequence
drafting 2-node trees (one draft forward), 3-node trees (two) and the largest trees. Each
kind's first step per batch size is discarded (on a GPU it records that shape's CUDA graph),
the median of the rest kept. Batch sizes ascending, the tables follow by difference:

    plain(B)  = the plain step                              (B target rows)
    draft(B)  = the 2-node step - plain(its rows)
    level(B)  = the 3-node step - plain(its rows) - draft(B)
    plain(rows of the largest trees) = the largest-tree step - draft(B) - level(B) * (forwards - 1)

the last only where those rows lie past every plain decode step measured, so the plain table
reaches the row counts trees produce without extrapolating. At the largest size, FEED_GAP plain
steps then one largest-tree step price feeding the head what sequences owe after not drafting
(seconds per owed entry). The synthetic requests are finished and their worker state dropped
before the engine takes its first request.
"""

from __future__ import annotations

import logging
import time

from eagle_core.batch import ScheduledBatch
from eagle_core.config import EngineConfig
from eagle_core.kv import BlockManager, blocks_needed
from eagle_core.request import Request
from eagle_core.sampling_params import SamplingParams
from eagle_core.scheduler import Scheduler
from eagle_core.spec.policy import Choice, CostTable, StepCosts

logger = logging.getLogger(__name__)

PROMPT_TOKENS = 16
TIMED_STEPS = 3
"""Timed steps of each kind per batch size (after one discarded)."""
FEED_GAP = 32
"""Plain steps before the drafting step that prices feeding owed entries."""


class _Pinned:
    """A stand-in policy: every decoding sequence drafts trees of `tree_nodes` nodes (None: none
    drafts)."""

    decides_lookup = True

    def __init__(self):
        self.tree_nodes: int | None = None

    def choose(self, candidates, other_rows=0) -> Choice:
        if self.tree_nodes is None:
            return Choice(frozenset(), frozenset(), 0.0)
        return Choice(frozenset(c.request_id for c in candidates if c.head), frozenset(), 0.0, tree_nodes=self.tree_nodes)

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
    """Median seconds of plain and drafting decode steps by batch size, turned into the policy's
    tables (see the module docstring). `blocks` must have no block in use."""
    tree_slots = worker.num_tree_slots
    largest = tree_slots + 1
    depth = max(min(config.spec.depth, largest - 1), 1)
    kinds = [None, *sorted({2, 3, largest} if depth >= 2 else {2, largest})]  # None: plain
    pinned = _Pinned()
    scheduler = Scheduler(config.scheduler, blocks, num_draft_slots=tree_slots, policy=pinned)
    per_request = PROMPT_TOKENS + (len(kinds) * TIMED_STEPS + 3) * largest + FEED_GAP + 1
    vocab = worker.vocab_size
    medians: dict[int, dict[int | None, tuple[float, int]]] = {}  # batch size -> kind -> (seconds, rows)
    fed = (0.0, 0)
    start = time.perf_counter()
    sizes = [
        size for size in batch_sizes(config.scheduler.max_num_seqs)
        if size * blocks_needed(per_request, blocks.block_size) <= blocks.num_free_blocks  # the KV pool holds them
        and size * largest <= config.scheduler.max_num_batched_tokens
    ]
    for size in sizes:
        ids = [f"cost-{size}-{i}" for i in range(size)]
        params = SamplingParams(temperature=0, ignore_eos=True)
        for i, request_id in enumerate(ids):
            prompt = [(7 * (i + j) + 3) % vocab for j in range(PROMPT_TOKENS)]
            scheduler.add(Request(request_id, prompt, params, per_request - PROMPT_TOKENS))
        pinned.tree_nodes = None
        while any(not r.output_token_ids for r in scheduler.running) or scheduler.waiting:
            _step(worker, scheduler)  # prefill
        times: dict[int | None, list[tuple[float, int]]] = {kind: [] for kind in kinds}
        for _ in range(TIMED_STEPS + 1):
            for kind in kinds:
                pinned.tree_nodes = kind
                times[kind].append(_step(worker, scheduler))
        medians[size] = {kind: sorted(steps[1:])[TIMED_STEPS // 2] for kind, steps in times.items()}
        if size == sizes[-1]:
            pinned.tree_nodes = None
            for _ in range(FEED_GAP):
                _step(worker, scheduler)
            pinned.tree_nodes = largest
            fed = _step(worker, scheduler)
        for request_id in ids:
            scheduler.finish(request_id, "abort")
        worker.execute(ScheduledBatch(seqs=[], finished_request_ids=scheduler.schedule().finished_request_ids))
    costs = _tables(medians, depth)
    if sizes:
        seconds, rows = fed
        costs.feed = max(seconds - costs.step(rows, sizes[-1]), 0.0) / (sizes[-1] * FEED_GAP)
    logger.info(
        "step costs measured in %.1f s: plain %s (ms by target rows); drafting adds %s and %s per further "
        "level (ms by drafting sequences); feeding the head %.3f ms per owed entry",
        time.perf_counter() - start, _ms(costs.plain.as_dict()), _ms(costs.draft.as_dict()),
        _ms(costs.level.as_dict()), 1e3 * costs.feed,
    )
    return costs


def _tables(medians: dict[int, dict[int | None, tuple[float, int]]], depth: int) -> StepCosts:
    """The policy's tables from each batch size's median (seconds, rows) by step kind (None:
    plain; else tree nodes), batch sizes ascending (see the module docstring)."""
    plain = CostTable({size: kinds[None][0] for size, kinds in medians.items()})
    draft: dict[int, float] = {}
    level: dict[int, float] = {}
    decode_rows = max(medians)
    for size, kinds in sorted(medians.items()):
        seconds, rows = kinds[2]
        draft[size] = max(seconds - plain(rows), 1e-6)
        if 3 in kinds and depth >= 2:
            seconds, rows = kinds[3]
            level[size] = max(seconds - plain(rows) - draft[size], 0.0)
        largest = max(kind for kind in kinds if kind is not None)
        seconds, rows = kinds[largest]
        derived = {2, 3} if size in level else {2}  # kinds the draft tables came from
        if rows > decode_rows and largest not in derived:
            plain.add(rows, seconds - draft[size] - level.get(size, 0.0) * (depth - 1))
    return StepCosts(plain.as_dict(), draft, level or None, depth=depth)


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
