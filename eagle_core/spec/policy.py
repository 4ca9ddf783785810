"""The speculation policy: which decoding sequences draft each step, priced on this machine.

Each step the scheduler asks `SpeculationPolicy.choose` which decoding sequences build a tree
with the draft head, and which of the others may verify a context-lookup chain alone. The
answer maximises the step's expected emitted tokens per second of the whole step:

    goodput(k) = (B + sum of the k largest expected acceptances) / step(B, k)

over k = 0..B, where B sequences decode and the k with the most expected accepted draft tokens
per step draft with the head (every head tree costs the same, so the best k-subset is the top
k). k = 0 is plain decoding, chosen whenever no tree pays.

Costs (`StepCosts`): `plain(r)`, the seconds of a step whose target forward computes r decode
rows and nobody drafts, and `spec(k)`, the seconds of a step in which k sequences draft the
configured tree. A mixed step costs spec(k) + plain(rows) - plain(k): the rows beyond the
drafting sequences' own at plain prices; plus `feed` seconds per draft entry the drafting
sequences owe the head (a sequence that did not draft for a while first feeds it the features
it kept, up to `max_owed` entries: spec/drafter.py). All three are measured on this machine at
start-up (eagle_core/step_costs.py) and follow every decode-only step's wall time afterwards.

Acceptance (`Acceptance`): per request, a moving average of the draft tokens a step accepted,
one for head trees and one for lookup chains alone (with the rows such a chain verified); a
request without its own history takes the running average of requests sampled like it (greedy
or not: temperature is a signal, not a special case). While a request does not draft, its
estimate drifts back toward that average, so a request whose drafts failed is tried again
later; and while no sequence drafts at all, a probe step now and then lets the best candidate
draft, which keeps the averages and the spec table current at a bounded share of the time.

No tensors here: numbers in, request ids out.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass

from eagle_core.batch import ScheduledBatch, StepResult

logger = logging.getLogger(__name__)

COST_RATE = 0.1
"""Weight of one observed step in the cost tables' moving averages."""
REQUEST_RATE = 0.3
"""Weight of one step in a request's own acceptance averages."""
PRIOR_RATE = 0.02
"""Weight of one sequence-step in the averages over all requests (new requests' estimates)."""
RELAX_RATE = 1 / 16
"""Per step without drafting, how far a request's estimate moves back toward the average."""
PROBE_SHARE = 0.01
"""Most extra time probe steps may add to plain decoding (they set the probe interval), unless
that would space them more than MAX_PROBE_INTERVAL steps apart."""
MAX_PROBE_INTERVAL = 512
INITIAL_HEAD_ACCEPTANCE = 1.0
"""Accepted head draft tokens per step assumed before any request has drafted: optimistic, so
the first steps draft wherever that pays, and measurements take over within a few steps."""
INITIAL_LOOKUP_ACCEPTANCE = 0.5
INITIAL_LOOKUP_ROWS = 2.0


class CostTable:
    """Seconds as a piecewise-linear function of a count, through measured points; constant
    below the first point, along the last segment's slope (never negative) past the last."""

    def __init__(self, points: dict[int, float]):
        if not points:
            raise ValueError("a cost table needs at least one point")
        self.xs = sorted(points)
        self.ys = [max(points[x], 0.0) for x in self.xs]

    def __call__(self, n: float) -> float:
        (lo, hi), (w_lo, w_hi) = self._bracket(n)
        if lo == hi:
            return self.ys[lo] + (self._slope() * (n - self.xs[hi]) if n > self.xs[hi] else 0.0)
        return w_lo * self.ys[lo] + w_hi * self.ys[hi]

    def observe(self, n: float, seconds: float, rate: float = COST_RATE) -> None:
        """Move the points around n toward an observed value at n, in proportion to how much
        each contributes to the value there."""
        residual = seconds - self(n)
        (lo, hi), (w_lo, w_hi) = self._bracket(n)
        if lo == hi:
            scale = 1.0 if n <= self.xs[hi] else self.xs[hi] / n  # a far point says less
            self.ys[hi] = max(self.ys[hi] + rate * scale * residual, 1e-6)
            return
        self.ys[lo] = max(self.ys[lo] + rate * w_lo * residual, 1e-6)
        self.ys[hi] = max(self.ys[hi] + rate * w_hi * residual, 1e-6)

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.xs, self.ys))

    def _bracket(self, n: float) -> tuple[tuple[int, int], tuple[float, float]]:
        """Indices of the points around n and their interpolation weights."""
        i = bisect.bisect_left(self.xs, n)
        if i == 0:
            return (0, 0), (0.0, 1.0)
        if i == len(self.xs):
            return (i - 1, i - 1), (0.0, 1.0)
        x0, x1 = self.xs[i - 1], self.xs[i]
        w_hi = (n - x0) / (x1 - x0)
        return (i - 1, i), (1.0 - w_hi, w_hi)

    def _slope(self) -> float:
        if len(self.xs) < 2:
            return self.ys[-1] / self.xs[-1]
        return max((self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]), 0.0)


class StepCosts:
    """What a decode step costs on this machine (see the module docstring)."""

    def __init__(self, plain: dict[int, float], spec: dict[int, float], feed: float = 0.0):
        self.plain = CostTable(plain)
        """Decode rows of the target forward -> seconds of a step where nobody drafts."""
        self.spec = CostTable(spec)
        """Sequences drafting the configured tree -> seconds of a step of just those."""
        self.feed = max(feed, 0.0)
        """Seconds per owed draft entry fed before drafting."""

    def step(self, rows: float, drafting: int, owed: float = 0.0) -> float:
        """Seconds of a step computing `rows` rows besides the trees of `drafting` sequences
        (each drafting sequence's root counts among the rows), which owe the head `owed`
        entries beyond the one or few a sequence drafting every step owes."""
        if drafting == 0:
            return self.plain(rows)
        return self.spec(drafting) + self.plain(rows) - self.plain(drafting) + self.feed * owed

    def observe(self, rows: float, drafting: int, seconds: float, owed: float = 0.0) -> None:
        """Learn from a decode-only step's wall time: the plain table from a step where nobody
        drafted, the spec table from one whose drafting sequences owed nothing extra, else the
        per-entry feeding cost."""
        if drafting == 0:
            self.plain.observe(rows, seconds)
        elif owed <= 0:
            self.spec.observe(drafting, seconds - (self.plain(rows) - self.plain(drafting)))
        else:
            residual = seconds - self.step(rows, drafting)
            self.feed = max(self.feed + COST_RATE * (residual / owed - self.feed), 0.0)

    def as_dict(self) -> dict:
        return {"plain": self.plain.as_dict(), "spec": self.spec.as_dict(), "feed": self.feed}


@dataclass
class _Estimates:
    """One request's acceptance averages; None until it has its own history."""

    head: float | None = None
    lookup: float | None = None
    lookup_rows: float | None = None


def _mix(old: float | None, new: float, rate: float) -> float:
    return new if old is None else old + rate * (new - old)


class Acceptance:
    """Expected accepted draft tokens per step, per request and per source (see the module
    docstring)."""

    def __init__(self):
        self.prior = {
            greedy: _Estimates(INITIAL_HEAD_ACCEPTANCE, INITIAL_LOOKUP_ACCEPTANCE, INITIAL_LOOKUP_ROWS)
            for greedy in (True, False)
        }
        self.requests: dict[str, _Estimates] = {}

    def head(self, request_id: str, greedy: bool) -> float:
        own = self.requests.get(request_id)
        return own.head if own is not None and own.head is not None else self.prior[greedy].head

    def lookup(self, request_id: str, greedy: bool) -> tuple[float, float]:
        """(accepted tokens, verified rows) per lookup-alone step."""
        own = self.requests.get(request_id)
        prior = self.prior[greedy]
        if own is None or own.lookup is None:
            return prior.lookup, prior.lookup_rows
        return own.lookup, own.lookup_rows

    def record_head(self, request_id: str, greedy: bool, accepted: int) -> None:
        own = self.requests.setdefault(request_id, _Estimates())
        own.head = _mix(own.head, accepted, REQUEST_RATE)
        prior = self.prior[greedy]
        prior.head = _mix(prior.head, accepted, PRIOR_RATE)

    def record_lookup(self, request_id: str, greedy: bool, accepted: int, rows: int) -> None:
        own = self.requests.setdefault(request_id, _Estimates())
        own.lookup = _mix(own.lookup, accepted, REQUEST_RATE)
        own.lookup_rows = _mix(own.lookup_rows, rows, REQUEST_RATE)
        prior = self.prior[greedy]
        prior.lookup = _mix(prior.lookup, accepted, PRIOR_RATE)
        prior.lookup_rows = _mix(prior.lookup_rows, rows, PRIOR_RATE)

    def relax(self, request_id: str, greedy: bool) -> None:
        """A step in which this request did not draft with the head: its head estimate moves
        toward the average of requests like it."""
        own = self.requests.get(request_id)
        if own is not None and own.head is not None:
            own.head += RELAX_RATE * (self.prior[greedy].head - own.head)

    def drop(self, request_id: str) -> None:
        self.requests.pop(request_id, None)


@dataclass(frozen=True)
class Candidate:
    """A decoding sequence that could draft this step."""

    request_id: str
    greedy: bool
    head: bool
    """The draft head may build its tree (room and budget allow it)."""
    context_len: int = 0
    """Tokens in the sequence's KV before this step (what the draft head may owe)."""


@dataclass(frozen=True)
class Choice:
    head: frozenset[str]
    """Requests that draft with the head this step."""
    lookup_alone: frozenset[str]
    """Requests without a head tree that may verify a context-lookup chain alone."""
    goodput: float
    """Expected emitted tokens per second of the chosen step."""
    probe: bool = False


STEADY_OWED = 4
"""Draft entries a sequence drafting every step owes (its root and accepted tokens): the start-up
spec table includes them; only owed entries past these are priced at `feed`."""


class SpeculationPolicy:
    def __init__(self, costs: StepCosts, lookup: bool = True, max_owed: int = 1 << 30):
        """`lookup`: the policy also decides lookup-alone steps (False: the scheduler's pinned
        --lookup-max-batch does). `max_owed`: most entries a sequence can owe the draft head
        (the drafter keeps no more features than that)."""
        self.costs = costs
        self.acceptance = Acceptance()
        self.decides_lookup = lookup
        self.max_owed = max_owed
        self.fed: dict[str, int] = {}
        """Request -> its context length when it last drafted with the head (the head has been
        fed everything before)."""
        self.steps_without_head = 0
        self.last: Choice | None = None

    def choose(self, candidates: list[Candidate], other_rows: int = 0) -> Choice:
        """The step's drafting: `candidates` are the decoding sequences, `other_rows` the
        step's other target rows (prefill chunks)."""
        num = len(candidates)
        rows = num + other_rows
        plain_goodput = num / self.costs.step(rows, 0) if num else 0.0
        # Best first: expected accepted tokens, less those the time of feeding the head what
        # the sequence owes would have produced decoding plainly.
        ranked = sorted(
            (
                (gain - plain_goodput * self.costs.feed * owed, gain, owed, c.request_id)
                for c in candidates
                if c.head
                for gain, owed in [(self.acceptance.head(c.request_id, c.greedy), self._owed(c.request_id, c.context_len))]
            ),
            reverse=True,
        )
        gains = [(gain, request_id) for _, gain, _, request_id in ranked]
        best_k, best = 0, plain_goodput
        tokens = float(num)
        owed = 0.0
        for k, (_, gain, extra, _) in enumerate(ranked, start=1):
            tokens += gain
            owed += extra
            goodput = tokens / self.costs.step(rows, k, owed)
            if goodput > best:
                best_k, best = k, goodput
        probe = False
        if best_k == 0 and gains:
            self.steps_without_head += 1
            if self.steps_without_head >= self._probe_interval(rows):
                best_k, probe = 1, True
        if best_k:
            self.steps_without_head = 0
        head = frozenset(request_id for _, request_id in gains[:best_k])
        lookup = frozenset(self._lookup_alone(candidates, head, rows, best)) if self.decides_lookup else frozenset()
        for c in candidates:
            if c.request_id not in head:
                self.acceptance.relax(c.request_id, c.greedy)
        choice = Choice(head, lookup, best, probe)
        if self.last is None or len(choice.head) != len(self.last.head):
            logger.debug(
                "speculation: %d of %d decoding sequences draft with the head%s (expected %.1f tokens/s; "
                "plain step %.2f ms, this step %.2f ms)",
                len(head), num, " (probe)" if probe else "", best,
                1e3 * self.costs.step(rows, 0), 1e3 * self.costs.step(rows, len(head)),
            )
        self.last = choice
        return choice

    def _owed(self, request_id: str, context_len: int) -> int:
        """Entries past STEADY_OWED the request would feed the head before drafting."""
        owed = min(context_len - self.fed.get(request_id, 0), self.max_owed)
        return max(owed - STEADY_OWED, 0)

    def _lookup_alone(self, candidates: list[Candidate], head: frozenset[str], rows: int, goodput: float) -> list[str]:
        """Non-drafting sequences whose expected lookup gain per second of extra rows beats the
        step's goodput."""
        chosen = []
        drafting = len(head)
        for c in candidates:
            if c.request_id in head:
                continue
            accepted, extra = self.acceptance.lookup(c.request_id, c.greedy)
            added = self.costs.step(rows + extra, drafting) - self.costs.step(rows, drafting)
            if added <= 0 or accepted / added > goodput:
                chosen.append(c.request_id)
                rows += extra
        return chosen

    def _probe_interval(self, rows: int) -> int:
        """Plain steps between probes, so that probes add at most PROBE_SHARE to the time."""
        plain = self.costs.step(rows, 0)
        extra = max(self.costs.step(rows, 1) - plain, 0.0)
        return min(MAX_PROBE_INTERVAL, max(4, math.ceil(extra / (PROBE_SHARE * plain))))

    def observe(self, batch: ScheduledBatch, result: StepResult, seconds: float) -> None:
        """Learn from a finished step: every decode result's acceptance, and (for steps with no
        prefill) the step's wall time, with what its drafting sequences owed the head."""
        decode_only = True
        rows = drafting = 0
        owed = 0
        for work in batch.seqs:
            if not work.is_decode:
                decode_only = False
                continue
            seq_result = result.results.get(work.request_id)
            if seq_result is None:
                continue
            is_greedy = work.params.greedy
            if work.drafts_with_head and seq_result.num_draft_tokens:
                drafting += 1
                rows += 1
                owed += self._owed(work.request_id, work.start_pos)
                self.fed[work.request_id] = work.start_pos
                self.acceptance.record_head(work.request_id, is_greedy, seq_result.num_accepted_tokens)
            elif work.num_draft_slots and not work.drafts_with_head:
                rows += 1 + seq_result.num_draft_tokens
                self.acceptance.record_lookup(
                    work.request_id, is_greedy, seq_result.num_accepted_tokens, seq_result.num_draft_tokens
                )
            else:  # plain, or a head tree that came to nothing (all of it forbidden by a grammar)
                rows += 1
        if decode_only and rows:
            self.costs.observe(rows, drafting, seconds, owed)

    def admit(self, request_id: str, start: int) -> None:
        """The request (re)starts computing at position `start` (0, or past its prefix-cache
        hit), where its draft head's context starts too: it owes the entries from there."""
        self.fed[request_id] = start

    def drop(self, request_id: str) -> None:
        self.acceptance.drop(request_id)
        self.fed.pop(request_id, None)

    def as_dict(self) -> dict:
        """The policy's state for metrics and /debug: the last choice and the cost tables."""
        last = self.last
        return {
            "drafting": len(last.head) if last else 0,
            "lookup_alone": len(last.lookup_alone) if last else 0,
            "expected_tokens_per_second": last.goodput if last else 0.0,
            "costs": self.costs.as_dict(),
            "head_acceptance": {"greedy": self.acceptance.prior[True].head, "sampling": self.acceptance.prior[False].head},
        }
