"""The speculation policy: which decoding sequences draft each step, and how large a tree, priced
on this machine.

Each step the scheduler asks `SpeculationPolicy.choose` which decoding sequences build a tree
with the draft head, of how many nodes, and which of the others may verify a context-lookup
chain alone. The answer maximises the step's expected emitted tokens per second:

    goodput(k, n) = (B + sum of the k largest expected acceptances with n-node trees) / step(k, n)

over k = 0..B drafting sequences and tree sizes n = 2..N (N the configured tree, the largest;
only N when --num-draft-tokens pins it), where B sequences decode. k = 0 is plain decoding,
chosen whenever no tree pays. In a step that also prefills, B becomes the tokens plain decoding
would emit in the time the plain step takes (B / plain(B) * plain(B + prefill rows)): the
prefill is done either way, and a draft must come faster than plain decoding's tokens, not
than the slow prefill step's.

Costs (`StepCosts`): `plain(r)`, the seconds of a step whose target forward computes r rows
(decode tokens and tree nodes alike); for k drafting sequences, `draft(k)`, the seconds their
first draft forward and the tree bookkeeping add, and `level(k)`, the seconds of each further
draft forward: a tree of n nodes reaches depth n - 1 at most, so it takes min(depth, n - 1)
forwards. Plus `feed` seconds per draft entry the drafting sequences owe the head (a sequence
that did not draft for a while first feeds it the features it kept, up to `max_owed` entries:
spec/drafter.py). All are measured on this machine at start-up (eagle_core/step_costs.py) and
follow every decode-only step's wall time afterwards.

Acceptance (`Acceptance`): per request, moving averages of the draft tokens a step accepted,
for head trees by tree size, and for lookup chains alone (with the rows such a chain verified).
Every tree node carries its rank in its step's score order (DraftTree.ranks), and the tree of
the best n nodes holds exactly the nodes of rank < n; verification walks one path whatever the
tree (spec/verify.py), so a step that drafted n nodes tells what every smaller tree would have
accepted: the path up to its first node of rank n or more. A request's averages start at the
running average of requests sampled like it (greedy or not: temperature is a signal, not a
special case) and move by REQUEST_RATE a step; steps in an answer's opening (OPENING_TOKENS)
are not recorded. While a request does not draft, its estimates drift back toward that
average, so a request whose drafts failed is tried again later. Two kinds of probe keep what
the policy does not choose measured, each at a bounded share of the time: while no sequence
drafts at all, a step now and then lets the best candidate draft a full tree (the averages and
the draft table stay current); while the chosen trees are smaller than the largest, a drafting
step now and then drafts the largest instead (a small tree says nothing about larger ones).

Both forecasts of a drafting step are biased in ways no single estimate shows: the sequences
chosen are those whose moving averages are highest, partly by chance, so they accept less than
their averages say; and rows the choice does not see (lookup chains grafted onto head trees,
lookup chains priced as plain rows) lengthen the step. `Realization` measures both: accepted
drafts over those expected, and seconds over those predicted, in the steps that drafted, apart
by load (decoding sequences, in powers of two); the choice scales every drafting option's gains
and time by those of its load.

No tensors here: numbers in, request ids out.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass
from typing import NamedTuple

from eagle_core.batch import ScheduledBatch, StepResult

logger = logging.getLogger(__name__)

COST_RATE = 0.1
"""Weight of one observed step in the cost tables' moving averages, once a point has been
observed 1 / COST_RATE - 2 times: before that a point is the running mean of its start-up value
(counted as one observation) and its observations, so a start-up measurement disturbed by
another process is soon replaced. One observation moves a point by a factor 1 + its rate at most
(`CostTable.observe`)."""
MIN_MOVE = 1e-4
"""Seconds: a cost point below this moves as if it were this large (a point measured as ~0 can
still grow)."""
MIN_COST = 1e-6
"""Seconds: the least a cost point holds (every point stays positive, so ratios are defined)."""
REQUEST_RATE = 0.3
"""Weight of one step in a request's own acceptance averages, from its first step on: they
start at the average over requests like it, which thus counts as about 1 / REQUEST_RATE - 1
steps. (One step alone says little: an answer's first tokens are often the hardest to draft,
and a first step that accepted nothing must not stop a request from drafting.)"""
PRIOR_RATE = 0.02
"""Weight of one sequence-step in the averages over all requests (new requests' estimates),
once they hold 1 / PRIOR_RATE steps; before that each is the plain mean of the steps recorded
and its initial value, counted as one step (`Acceptance.record_head`)."""
OPENING_TOKENS = 4
"""Head trees drafted before an answer has this many tokens are not recorded in the acceptance
averages: an answer's first tokens (which topic, which wording) are the hardest to draft, so
its first drafting steps say little of its later ones, and, being the steps every request
drafts, they would weigh most in the averages over requests, which would then keep new
requests from drafting at all."""
RELAX_RATE = 1 / 16
"""Per step without drafting, how far a request's estimate moves back toward the average."""
PROBE_SHARE = 0.01
"""Most extra time probe steps may add to plain decoding (they set the probe interval), unless
that would space them more than MAX_PROBE_INTERVAL steps apart."""
MAX_PROBE_INTERVAL = 512
PAST_PEAK = 0.8
"""Adding drafting sequences stops once the expected rate falls below this share of its peak
for the tree size at hand (a saving of Python time per step: the rate rises, then falls)."""
INITIAL_HEAD_ACCEPTANCE = 1.0
"""Accepted head draft tokens per step assumed before any request has drafted: optimistic, so
the first steps draft wherever that pays, and measurements take over within a few steps."""
INITIAL_LOOKUP_ACCEPTANCE = 0.5
INITIAL_LOOKUP_ROWS = 2.0
REALIZED_RATE = 0.05
"""Weight of one drafting step in `Realization`'s ratios (about the last 20 drafting steps)."""
REALIZED_PRIOR_STEPS = 4.0
"""Steps' worth of forecasts taken as come true before `Realization` has seen any."""
REALIZED_BOUNDS = (0.1, 4.0)
"""Least and most either `Realization` ratio holds (a few steps' noise cannot stop drafting
for good, nor make it look free)."""


class CostTable:
    """Seconds as a piecewise-linear function of a count, through measured points; constant
    below the first point, along the last segment's slope (never negative) past the last
    (constant with one point). More never costs less: the points are kept non-decreasing, so a
    noisy measurement cannot make extra rows look free."""

    def __init__(self, points: dict[int, float], carry_rises: bool = True):
        if not points:
            raise ValueError("a cost table needs at least one point")
        self.carry_rises = carry_rises
        """Whether the points past an observed point follow all its moves, or only those below
        its start-up value (see `observe`)."""
        self.xs = sorted(points)
        self.ys = [max(points[x], MIN_COST) for x in self.xs]
        self.seen = [0.0] * len(self.xs)
        """Per point, the observations that have moved it (weighted by their share of it)."""
        self._monotone()
        self.start = list(self.ys)
        """Per point, its start-up value (see `carry_rises`)."""

    def __call__(self, n: float) -> float:
        (lo, hi), (w_lo, w_hi) = self._bracket(n)
        if lo == hi:
            return self.ys[lo] + (self._slope() * (n - self.xs[hi]) if n > self.xs[hi] else 0.0)
        return w_lo * self.ys[lo] + w_hi * self.ys[hi]

    def observe(self, n: float, seconds: float, rate: float = COST_RATE) -> None:
        """Move the points around n toward an observed value at n, in proportion to how much
        each contributes to the value there, each by at most a factor 1 + its rate (`_move`); the
        points past them keep their ratio to the nearer one (what made this count dearer, longer
        contexts say, makes larger counts dearer too, and a point rarely observed must not fall
        below a smaller count's). A point's rate is `rate`, or 1 / (observations + 2) while that
        is larger: its first observations weigh like its start-up value (`COST_RATE`).

        Without `carry_rises`, the points past follow the observed point's moves below its
        start-up value only: what it is worth under that value is taken as shared, what it is
        worth above as its own. That is for tables whose start-up points are differences of
        measured steps (the draft forwards'): one that noise made low at start-up rises to its
        truth alone, which says nothing of the others (an overpriced point may never be chosen,
        and so never observed: a level point carried up by its smaller neighbour's rise kept any
        two sequences from drafting), while one a disturbed start-up made high falls, and so
        does every point that the disturbance made high with it.

        The bound makes a point a moving median of what it is observed to cost, and keeps one
        outlier step (a pause of the process) from moving any point far: a draft table's first
        point is a share of a step a millisecond wide whose noise is several milliseconds, and
        unbounded moves dragged points to the floor and back, each time multiplying every point
        past them by the ratio of the two, until a table held seconds, or 1e68. The ratio passed
        on is taken at MIN_MOVE or above for the same reason: a point near the floor (a start-up
        difference of two noisy steps can be zero) moves by MIN_MOVE * rate, many times itself,
        and the floor made its falls smaller than its rises, so the points past it ratcheted up."""
        residual = seconds - self(n)
        (lo, hi), (w_lo, w_hi) = self._bracket(n)
        before = self.ys[hi]
        if lo == hi:
            scale = 1.0 if n <= self.xs[hi] else self.xs[hi] / n  # a far point says less
            self._move(hi, scale * residual, rate, scale)
        else:
            self._move(lo, w_lo * residual, rate, w_lo)
            self._move(hi, w_hi * residual, rate, w_hi)
        ceiling = math.inf if self.carry_rises else self.start[hi]
        ratio = min(max(self.ys[hi], MIN_MOVE), ceiling) / min(max(before, MIN_MOVE), ceiling)  # within 1 + its rate
        for j in range(hi + 1, len(self.ys)):
            self.ys[j] *= ratio
        self._monotone(anchor=hi)

    def _move(self, i: int, residual: float, rate: float, share: float) -> None:
        """ys[i] + its rate x residual, within a factor 1 + its rate of ys[i] (of MIN_MOVE,
        additively, below it): the same factor up and down, so a point settles at its
        observations' median. `share`: how much of the observation is this point's."""
        rate = max(rate, 1.0 / (self.seen[i] + 2))
        self.seen[i] += share
        change = rate * residual
        y = self.ys[i]
        if y >= MIN_MOVE:
            self.ys[i] = min(max(y + change, y / (1 + rate)), y * (1 + rate))
        else:
            bound = rate * MIN_MOVE
            self.ys[i] = max(y + min(max(change, -bound), bound), MIN_COST)

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.xs, self.ys))

    def add(self, x: int, seconds: float) -> None:
        """A measured point (averaged with one already at x)."""
        i = bisect.bisect_left(self.xs, x)
        if i < len(self.xs) and self.xs[i] == x:
            self.ys[i] = (self.ys[i] + max(seconds, MIN_COST)) / 2
        else:
            self.xs.insert(i, x)
            self.ys.insert(i, max(seconds, MIN_COST))
            self.seen.insert(i, 0.0)
        self._monotone()
        self.start = list(self.ys)

    def _monotone(self, anchor: int = 0) -> None:
        """Make the points non-decreasing around the point at `anchor` (the one just observed):
        later points rise to it, earlier ones fall to it."""
        for j in range(anchor + 1, len(self.ys)):
            self.ys[j] = max(self.ys[j], self.ys[j - 1])
        for j in range(anchor - 1, -1, -1):
            self.ys[j] = min(self.ys[j], self.ys[j + 1])

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
            return 0.0  # one point says nothing of growth
        return max((self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]), 0.0)


class StepCosts:
    """What a decode step costs on this machine (see the module docstring)."""

    def __init__(
        self, plain: dict[int, float], draft: dict[int, float], level: dict[int, float] | None = None,
        feed: float = 0.0, depth: int = 1,
    ):
        self.plain = CostTable(plain)
        """Target rows (decode tokens and tree nodes) -> seconds of a step's target forward,
        sampling and verification; exactly a step's seconds where nobody drafts."""
        self.draft = CostTable(draft, carry_rises=False)
        """Drafting sequences -> seconds drafting trees of one draft forward adds to their step
        (the catch-up forward, tree selection and bookkeeping)."""
        self.level = CostTable(level or {1: 0.0}, carry_rises=False)
        """Drafting sequences -> seconds of each further draft forward (tree level)."""
        self.feed = max(feed, 0.0)
        """Seconds per owed draft entry fed before drafting."""
        self.depth = depth
        """Draft forwards of the largest tree: min(configured depth, its nodes - 1)."""

    def forwards(self, tree_nodes: int | None) -> int:
        """Draft forwards a tree of `tree_nodes` nodes takes (None: the largest): it reaches
        depth tree_nodes - 1."""
        return self.depth if tree_nodes is None else max(min(self.depth, tree_nodes - 1), 1)

    def step(self, rows: float, drafting: int, owed: float = 0.0, tree_nodes: int | None = None) -> float:
        """Seconds of a step whose target computes `rows` rows, `drafting` sequences among them
        drafting trees of `tree_nodes` nodes (None: the largest) that owe the head `owed`
        entries beyond the one or few a sequence drafting every step owes."""
        if drafting == 0:
            return self.plain(rows)
        return self.plain(rows) + self._drafting(drafting, tree_nodes) + self.feed * owed

    def observe(self, rows: float, drafting: int, seconds: float, owed: float = 0.0, tree_nodes: int | None = None) -> None:
        """Learn from a decode-only step's wall time: the plain table from a step where nobody
        drafted, the draft and level tables from one whose drafting sequences owed nothing
        extra (the miss shared in proportion to what each predicted), else the per-entry
        feeding cost."""
        if drafting == 0:
            self.plain.observe(rows, seconds)
        elif owed <= 0:
            first = self.draft(drafting)
            more = self.forwards(tree_nodes) - 1
            levels = self.level(drafting) * more
            residual = seconds - self.plain(rows) - first - levels
            share = levels / (first + levels) if more and first + levels > 0 else 0.0
            self.draft.observe(drafting, first + residual * (1 - share))
            if more:
                self.level.observe(drafting, (levels + residual * share) / more)
        else:
            residual = seconds - self.step(rows, drafting, tree_nodes=tree_nodes)
            self.feed = max(self.feed + COST_RATE * (residual / owed - self.feed), 0.0)

    def _drafting(self, drafting: int, tree_nodes: int | None) -> float:
        return self.draft(drafting) + self.level(drafting) * (self.forwards(tree_nodes) - 1)

    def as_dict(self) -> dict:
        return {"plain": self.plain.as_dict(), "draft": self.draft.as_dict(), "level": self.level.as_dict(),
                "feed": self.feed, "depth": self.depth}


@dataclass
class _Estimates:
    """One request's acceptance averages; None until it has its own history."""

    head: list[float] | None = None
    """Index n: accepted head draft tokens per step with a tree of n nodes (0 below n = 2)."""
    lookup: float | None = None
    lookup_rows: float | None = None
    head_steps: int = 0
    """Steps recorded into `head` (kept for the averages over all requests only)."""
    lookup_steps: int = 0


def _prior_rate(steps: int) -> float:
    """Weight of the `steps`-th step recorded into an average over all requests: the plain mean
    of the steps so far and the initial value (one step's worth) until that weight falls to
    PRIOR_RATE. A moving average at PRIOR_RATE from the start would keep the initial guess for
    about 1 / PRIOR_RATE steps, and where drafts are seldom chosen (sampled requests under a
    head that is weak there) the few steps that are measured would barely move it."""
    return max(PRIOR_RATE, 1.0 / (steps + 1))


def _mix(old: float | None, new: float, rate: float) -> float:
    return new if old is None else old + rate * (new - old)


def accepted_by_size(ranks: list[int], max_nodes: int) -> list[int]:
    """[n] -> the drafts a tree of the best n nodes would have accepted, for n <= max_nodes, from
    the ranks of the drafts a tree of max_nodes nodes accepted (in path order): the path up to
    its first node of rank n or more."""
    accepted = [0] * (max_nodes + 1)
    highest = 0
    for j, rank in enumerate(ranks, start=1):
        highest = max(highest, rank)
        for n in range(max(highest + 1, 2), max_nodes + 1):
            accepted[n] = j
    return accepted


class Acceptance:
    """Expected accepted draft tokens per step, per request and per source (see the module
    docstring)."""

    def __init__(self, max_nodes: int):
        self.max_nodes = max_nodes
        initial = [INITIAL_HEAD_ACCEPTANCE * max(n - 1, 0) / max(max_nodes - 1, 1) for n in range(max_nodes + 1)]
        self.prior = {
            greedy: _Estimates(list(initial), INITIAL_LOOKUP_ACCEPTANCE, INITIAL_LOOKUP_ROWS) for greedy in (True, False)
        }
        """Averages over all requests by greedy/sampled. The head's starts optimistic at the
        largest tree and in proportion to the nodes below it, so the first steps draft full
        trees, which measure every smaller size at once."""
        self.requests: dict[str, _Estimates] = {}

    def head(self, request_id: str, greedy: bool) -> list[float]:
        """[n] -> expected accepted drafts per step with a tree of n nodes."""
        own = self.requests.get(request_id)
        return own.head if own is not None and own.head is not None else self.prior[greedy].head

    def lookup(self, request_id: str, greedy: bool) -> tuple[float, float]:
        """(accepted tokens, verified rows) per lookup-alone step."""
        own = self.requests.get(request_id)
        prior = self.prior[greedy]
        if own is None or own.lookup is None:
            return prior.lookup, prior.lookup_rows
        return own.lookup, own.lookup_rows

    def record_head(self, request_id: str, greedy: bool, accepted: list[int], sizes: range) -> None:
        """A head tree's step: `accepted[n]` drafts a tree of n nodes accepted (or would have),
        known for the n in `sizes`."""
        own = self.requests.setdefault(request_id, _Estimates())
        prior = self.prior[greedy]
        if own.head is None:
            own.head = list(prior.head)
        prior.head_steps += 1
        prior_rate = _prior_rate(prior.head_steps)
        for n in sizes:
            own.head[n] += REQUEST_RATE * (accepted[n] - own.head[n])
            prior.head[n] += prior_rate * (accepted[n] - prior.head[n])

    def record_lookup(self, request_id: str, greedy: bool, accepted: int, rows: int) -> None:
        own = self.requests.setdefault(request_id, _Estimates())
        prior = self.prior[greedy]
        if own.lookup is None:
            own.lookup, own.lookup_rows = prior.lookup, prior.lookup_rows
        own.lookup = _mix(own.lookup, accepted, REQUEST_RATE)
        own.lookup_rows = _mix(own.lookup_rows, rows, REQUEST_RATE)
        prior.lookup_steps += 1
        prior.lookup = _mix(prior.lookup, accepted, _prior_rate(prior.lookup_steps))
        prior.lookup_rows = _mix(prior.lookup_rows, rows, _prior_rate(prior.lookup_steps))

    def relax(self, request_id: str, greedy: bool) -> None:
        """A step in which this request did not draft with the head: its head estimates move
        toward the averages of requests like it."""
        own = self.requests.get(request_id)
        if own is not None and own.head is not None:
            prior = self.prior[greedy].head
            for n, value in enumerate(own.head):
                own.head[n] = value + RELAX_RATE * (prior[n] - value)

    def drop(self, request_id: str) -> None:
        self.requests.pop(request_id, None)


class Realization:
    """How the policy's forecasts of its drafting steps come true: ratios of decayed sums over
    recent drafting steps (REALIZED_RATE), each 1 until a drafting step is seen and within
    REALIZED_BOUNDS. The forecasts it compares are the unscaled ones, so the ratios do not feed
    back into what they measure."""

    def __init__(self):
        self.expected = self.accepted = 0.0
        self.predicted = self.seconds = 0.0

    def observe(self, expected: float, accepted: float, predicted: float, seconds: float) -> None:
        """A decode-only step that drafted: `expected` accepted drafts and `predicted` seconds
        when it was chosen, `accepted` and `seconds` as it ran. The first one is preceded by
        REALIZED_PRIOR_STEPS steps like it that came true exactly, so that one step's luck
        moves the ratios by a share of that weight, not to the bounds."""
        if self.expected == 0 and self.predicted == 0:
            self.expected = self.accepted = REALIZED_PRIOR_STEPS * expected
            self.predicted = self.seconds = REALIZED_PRIOR_STEPS * predicted
        keep = 1.0 - REALIZED_RATE
        self.expected = keep * self.expected + expected
        self.accepted = keep * self.accepted + accepted
        self.predicted = keep * self.predicted + predicted
        self.seconds = keep * self.seconds + seconds

    @property
    def tokens(self) -> float:
        """Accepted drafts per expected one."""
        return _bounded(self.accepted / self.expected) if self.expected > 0 else 1.0

    @property
    def time(self) -> float:
        """Seconds a drafting step took per second predicted."""
        return _bounded(self.seconds / self.predicted) if self.predicted > 0 else 1.0


def _bounded(ratio: float) -> float:
    return min(max(ratio, REALIZED_BOUNDS[0]), REALIZED_BOUNDS[1])


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
    """Expected emitted tokens per second of the chosen step (a prefill's rows counted as the
    tokens plain decoding emits in their time)."""
    probe: bool = False
    tree_nodes: int | None = None
    """Nodes of each head tree, root included; None: the largest."""
    expected: float = 0.0
    """Accepted drafts the step is expected to yield (unscaled by `Realization`)."""
    seconds: float = 0.0
    """The step's predicted seconds (unscaled); 0 where it may prefill (not compared)."""


class _Ranked(NamedTuple):
    """A drafting candidate at one tree size, as `choose` ranks them (by `score`)."""

    score: float
    """Expected accepted drafts, less those the time of feeding the head would have decoded."""
    gain: float
    """Expected accepted drafts."""
    owed: int
    """Entries past STEADY_OWED it owes the head."""
    grafted: float
    """Lookup-chain rows grafted onto its tree (0 without grafts)."""
    request_id: str


STEADY_OWED = 4
"""Draft entries a sequence drafting every step owes (its root and accepted tokens): the start-up
draft table includes them; only owed entries past these are priced at `feed`."""


class SpeculationPolicy:
    def __init__(
        self, costs: StepCosts, max_tree_nodes: int, choose_size: bool = True, lookup: bool = True,
        max_owed: int = 1 << 30, grafts: bool = False,
    ):
        """`max_tree_nodes`: the configured tree (root included), the largest the policy drafts;
        `choose_size`: False drafts only that size (--num-draft-tokens pins it). `lookup`: the
        policy also decides lookup-alone steps (False: the scheduler's pinned
        --lookup-max-batch does). `max_owed`: most entries a sequence can owe the draft head
        (the drafter keeps no more features than that). `grafts`: the worker grafts each
        drafting sequence's context-lookup chain onto its head tree, so a tree verifies the
        chain's rows too (priced at the request's expected chain length)."""
        self.costs = costs
        self.max_tree_nodes = max_tree_nodes
        self.tree_sizes = list(range(2, max_tree_nodes + 1)) if choose_size else [max_tree_nodes]
        self.acceptance = Acceptance(max_tree_nodes)
        self.decides_lookup = lookup
        self.grafts = grafts
        self.max_owed = max_owed
        self.fed: dict[str, int] = {}
        """Request -> its context length when it last drafted with the head (the head has been
        fed everything before)."""
        self.steps_without_head = 0
        self.steps_with_small_trees = 0
        self.realized: dict[int, Realization] = {}
        """Realization by load: keyed by log2 of the decoding sequences' count, rounded down
        (`_realized`), since the more candidates a choice ranks, the more luck picks its best."""
        self.last: Choice | None = None
        self.steps_by_tree_nodes: dict[int, int] = {}
        """Tree size -> steps in which the head drafted trees of that size (since start)."""

    def choose(self, candidates: list[Candidate], other_rows: int = 0) -> Choice:
        """The step's drafting: `candidates` are the decoding sequences, `other_rows` the
        step's other target rows (prefill chunks)."""
        num = len(candidates)
        rows = num + other_rows
        # The plain decode rate. A step's other rows (prefill) are work that is done either way:
        # their time counts as worth what it is worth decoding plainly, so that drafting in such
        # a step pays only where its extra tokens come faster than plain decoding's (a prefill
        # step's own tokens per second are low, and beside them any draft would look cheap).
        plain_step = self.costs.step(rows, 0)  # this step with nobody drafting
        plain_goodput = num / (self.costs.step(num, 0) if other_rows else plain_step) if num else 0.0
        base_tokens = plain_goodput * plain_step  # num where other_rows = 0
        realized = self._realized(num)
        drafters = [  # (request, gains by tree size, owed entries, tokens feeding them costs, grafted rows)
            (c.request_id, self.acceptance.head(c.request_id, c.greedy), owed, plain_goodput * self.costs.feed * owed,
             self.acceptance.lookup(c.request_id, c.greedy)[1] if self.grafts else 0.0)
            for c in candidates
            if c.head
            for owed in [self._owed(c.request_id, c.context_len)]
        ]
        best = (plain_goodput, 0, self.max_tree_nodes)  # (goodput, drafting, tree nodes)
        ranked_at: dict[int, list[_Ranked]] = {}
        for n in self.tree_sizes:
            # Best first: expected accepted tokens, less those the time of feeding the head what
            # the sequence owes would have produced decoding plainly.
            ranked = sorted(
                (_Ranked(gains[n] - feeding, gains[n], owed, grafted, request_id)
                 for request_id, gains, owed, feeding, grafted in drafters),
                reverse=True,
            )
            ranked_at[n] = ranked
            tokens, owed_total, extra_rows, peak = base_tokens, 0.0, 0.0, 0.0
            for k, option in enumerate(ranked, start=1):
                tokens += realized.tokens * option.gain
                owed_total += option.owed
                extra_rows += n - 1 + option.grafted
                goodput = tokens / (realized.time * self.costs.step(rows + extra_rows, k, owed_total, n))
                if goodput > best[0]:
                    best = (goodput, k, n)
                peak = max(peak, goodput)
                if goodput < PAST_PEAK * peak:
                    break  # gains fall and costs grow with k: this size will not come back
        goodput, best_k, tree_nodes = best
        probe = False
        if best_k == 0 and drafters:
            self.steps_without_head += 1
            if self.steps_without_head >= self._probe_interval(rows, plain_step, ranked_at[self.max_tree_nodes][0].owed):
                best_k, tree_nodes, probe = 1, self.max_tree_nodes, True
        if best_k:
            self.steps_without_head = 0
        if best_k and tree_nodes < self.max_tree_nodes:
            self.steps_with_small_trees += 1
            chosen = self.costs.step(rows + best_k * (tree_nodes - 1), best_k, tree_nodes=tree_nodes)
            full = self.costs.step(rows + best_k * (self.max_tree_nodes - 1), best_k)
            if self.steps_with_small_trees >= self._interval(full - chosen, chosen):
                tree_nodes, probe = self.max_tree_nodes, True
        if best_k and tree_nodes == self.max_tree_nodes:
            self.steps_with_small_trees = 0
        picked = ranked_at[tree_nodes][:best_k] if best_k else []
        head = frozenset(option.request_id for option in picked)
        expected = sum(option.gain for option in picked)
        tree_rows = rows + sum(tree_nodes - 1 + option.grafted for option in picked)
        lookup, lookup_rows, lookup_expected = (
            self._lookup_alone(candidates, head, tree_rows, tree_nodes, goodput, realized)
            if self.decides_lookup else ([], 0.0, 0.0)
        )
        owed_total = sum(option.owed for option in picked)
        seconds = 0.0 if other_rows else self.costs.step(tree_rows + lookup_rows, len(head), owed_total, tree_nodes)
        for c in candidates:
            if c.request_id not in head:
                self.acceptance.relax(c.request_id, c.greedy)
        choice = Choice(head, frozenset(lookup), goodput, probe, tree_nodes, expected + lookup_expected, seconds)
        if head:
            self.steps_by_tree_nodes[tree_nodes] = self.steps_by_tree_nodes.get(tree_nodes, 0) + 1
        last = self.last
        if last is None or (len(choice.head), choice.tree_nodes) != (len(last.head), last.tree_nodes):
            logger.debug(
                "speculation: %d of %d decoding sequences draft %d-node trees with the head%s (expected "
                "%.1f tokens/s; plain step %.2f ms, this step %.2f ms)",
                len(head), num, tree_nodes, " (probe)" if probe else "", goodput,
                1e3 * self.costs.step(rows, 0), 1e3 * self.costs.step(tree_rows, len(head), tree_nodes=tree_nodes),
            )
        self.last = choice
        return choice

    def _realized(self, decoding: int) -> Realization:
        """The Realization of steps with `decoding` decoding sequences."""
        return self.realized.setdefault(max(decoding, 1).bit_length() - 1, Realization())

    def _owed(self, request_id: str, context_len: int) -> int:
        """Entries past STEADY_OWED the request would feed the head before drafting."""
        owed = min(context_len - self.fed.get(request_id, 0), self.max_owed)
        return max(owed - STEADY_OWED, 0)

    def _lookup_alone(
        self, candidates: list[Candidate], head: frozenset[str], rows: float, tree_nodes: int, goodput: float,
        realized: Realization,
    ) -> tuple[list[str], float, float]:
        """Non-drafting sequences whose expected lookup gain per second of extra rows beats the
        step's goodput (both scaled by `Realization`); also the rows they add and the drafts
        they are expected to accept (unscaled)."""
        chosen, added_rows, expected = [], 0.0, 0.0
        drafting = len(head)
        for c in candidates:
            if c.request_id in head:
                continue
            accepted, extra = self.acceptance.lookup(c.request_id, c.greedy)
            added = self.costs.step(rows + extra, drafting, tree_nodes=tree_nodes) - self.costs.step(
                rows, drafting, tree_nodes=tree_nodes
            )
            if added <= 0 or realized.tokens * accepted / (realized.time * added) > goodput:
                chosen.append(c.request_id)
                rows += extra
                added_rows += extra
                expected += accepted
        return chosen, added_rows, expected

    def _probe_interval(self, rows: int, plain: float, owed: int) -> int:
        """Plain steps (`plain` seconds each, `rows` rows) between probes, so that probes add at
        most PROBE_SHARE to the time; the probing sequence owes the head `owed` entries, which it
        feeds in the probe step."""
        return self._interval(self.costs.step(rows + self.max_tree_nodes - 1, 1, owed) - plain, plain)

    @staticmethod
    def _interval(extra: float, seconds: float) -> int:
        """Steps of `seconds` between probes that cost `extra` more, so that probes add at most
        PROBE_SHARE to the time."""
        return min(MAX_PROBE_INTERVAL, max(4, math.ceil(max(extra, 0.0) / (PROBE_SHARE * seconds))))

    def observe(self, batch: ScheduledBatch, result: StepResult, seconds: float) -> None:
        """Learn from a finished step: every decode result's acceptance, and (for steps with no
        prefill) the step's wall time, with what its drafting sequences owed the head."""
        decode_only = True
        rows = drafting = accepted = 0
        owed = 0
        tree_nodes = 1
        last = self.last
        forecast = last.head | last.lookup_alone if last is not None else frozenset()  # who drafted by the choice
        for work in batch.seqs:
            if not work.is_decode:
                decode_only = False
                continue
            seq_result = result.results.get(work.request_id)
            if seq_result is None:
                continue
            is_greedy = work.params.greedy
            rows += 1 + seq_result.num_draft_tokens
            if work.request_id in forecast:
                accepted += seq_result.num_accepted_tokens
            if work.drafts_with_head and seq_result.num_draft_tokens:
                drafting += 1
                owed += self._owed(work.request_id, work.start_pos)
                self.fed[work.request_id] = work.start_pos
                nodes = min(work.num_tree_slots + 1, self.max_tree_nodes)
                tree_nodes = max(tree_nodes, nodes)
                if len(work.output_token_ids) >= OPENING_TOKENS:
                    self._record_head(work.request_id, is_greedy, seq_result, nodes)
            elif work.num_draft_slots and not work.drafts_with_head:
                self.acceptance.record_lookup(
                    work.request_id, is_greedy, seq_result.num_accepted_tokens, seq_result.num_draft_tokens
                )
            # else: plain, or a head tree that came to nothing (all of it forbidden by a grammar)
        if decode_only and rows:
            self.costs.observe(rows, drafting, seconds, owed, tree_nodes if drafting else None)
            if last is not None and last.seconds > 0 and forecast:
                self._realized(len(batch.seqs)).observe(last.expected, accepted, last.seconds, seconds)

    def _record_head(self, request_id: str, greedy: bool, seq_result, nodes: int) -> None:
        """Acceptance by tree size from a head tree of `nodes` nodes: every size up to it where
        the accepted drafts' ranks are known, else that size alone."""
        if seq_result.accepted_ranks is not None:
            accepted = accepted_by_size(seq_result.accepted_ranks, self.max_tree_nodes)
            self.acceptance.record_head(request_id, greedy, accepted, range(2, nodes + 1))
        else:
            accepted = [0] * (self.max_tree_nodes + 1)
            accepted[nodes] = seq_result.num_accepted_tokens
            self.acceptance.record_head(request_id, greedy, accepted, range(nodes, nodes + 1))

    def admit(self, request_id: str, start: int) -> None:
        """The request (re)starts computing at position `start` (0, or past its prefix-cache
        hit), where its draft head's context starts too: it owes the entries from there."""
        self.fed[request_id] = start

    def drop(self, request_id: str) -> None:
        self.acceptance.drop(request_id)
        self.fed.pop(request_id, None)

    def as_dict(self) -> dict:
        """The policy's state for metrics and /debug: the last choice, the cost tables and the
        average acceptance by tree size."""
        last = self.last
        return {
            "drafting": len(last.head) if last else 0,
            "tree_nodes": (last.tree_nodes or self.max_tree_nodes) if last and last.head else 0,
            "lookup_alone": len(last.lookup_alone) if last else 0,
            "expected_tokens_per_second": last.goodput if last else 0.0,
            "realized": {1 << load: {"tokens": r.tokens, "time": r.time} for load, r in sorted(self.realized.items())},
            "steps_by_tree_nodes": dict(sorted(self.steps_by_tree_nodes.items())),
            "costs": self.costs.as_dict(),
            "head_acceptance": {
                sampling: {n: value for n, value in enumerate(self.acceptance.prior[greedy].head) if n >= 2}
                for sampling, greedy in (("greedy", True), ("sampling", False))
            },
        }
