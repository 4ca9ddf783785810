"""The speculation policy on synthetic step costs and acceptance (no model): who drafts as load,
acceptance and costs change."""

from __future__ import annotations

import math

import pytest

from eagle_core.batch import ScheduledBatch, SeqResult, SeqWork, StepResult
from eagle_core.sampling_params import SamplingParams
from eagle_core.spec.policy import (
    MAX_PROBE_INTERVAL,
    PROBE_SHARE,
    Candidate,
    CostTable,
    SpeculationPolicy,
    StepCosts,
)


def costs(plain_ms=(20.0, 0.5), spec_ms=(30.0, 8.0), sizes=(1, 2, 4, 8, 16, 32)) -> StepCosts:
    """Linear synthetic costs: plain a + b * rows, drafting c + d * sequences (ms)."""
    a, b = plain_ms
    c, d = spec_ms
    return StepCosts({n: (a + b * n) / 1e3 for n in sizes}, {n: (c + d * n) / 1e3 for n in sizes})


def candidates(n: int, greedy=True) -> list[Candidate]:
    return [Candidate(f"r{i}", greedy, head=True) for i in range(n)]


def record(policy: SpeculationPolicy, request_ids, accepted: float, times=10, greedy=True):
    for _ in range(times):
        for request_id in request_ids:
            policy.acceptance.record_head(request_id, greedy, accepted)


# ---- the cost table

def test_cost_table_interpolates_extrapolates_and_follows_observations():
    table = CostTable({1: 1.0, 4: 4.0, 8: 6.0})
    assert table(0) == 1.0 and table(2) == pytest.approx(2.0) and table(6) == pytest.approx(5.0)
    assert table(10) == pytest.approx(7.0)  # the last segment's slope
    for _ in range(200):
        table.observe(2, 3.0)
    assert table(2) == pytest.approx(3.0, rel=1e-3)
    assert table(8) == 6.0  # points outside the observed segment stay


def test_a_mixed_step_costs_the_trees_plus_the_other_rows_at_plain_prices():
    c = costs()
    assert c.step(4, 0) == pytest.approx(0.022)
    assert c.step(4, 4) == pytest.approx(0.062)
    assert c.step(4, 1) == pytest.approx(0.038 + 0.022 - 0.0205)


# ---- choices

def test_it_drafts_less_as_load_grows():
    policy = SpeculationPolicy(costs())
    record(policy, [f"r{i}" for i in range(32)], 1.5)
    drafting = [len(policy.choose(candidates(n)).head) for n in (1, 2, 4, 8, 16, 32)]
    assert drafting[0] == 1 and drafting[-1] == 0
    assert [k / n for k, n in zip(drafting, (1, 2, 4, 8, 16, 32))] == sorted(
        (k / n for k, n in zip(drafting, (1, 2, 4, 8, 16, 32))), reverse=True)


def test_it_drafts_more_as_acceptance_rises():
    counts = []
    for accepted in (0.1, 0.5, 1.0, 2.0, 4.0):
        policy = SpeculationPolicy(costs())
        record(policy, [f"r{i}" for i in range(4)], accepted)
        counts.append(len(policy.choose(candidates(4)).head))
    assert counts[0] == 0 and counts[-1] == 4 and counts == sorted(counts)


def test_the_requests_that_accept_most_draft_first():
    policy = SpeculationPolicy(costs())
    record(policy, ["r0", "r2"], 0.0)
    record(policy, ["r1", "r3"], 3.0)
    assert policy.choose(candidates(4)).head == {"r1", "r3"}


def test_nothing_drafts_where_drafting_cannot_pay_except_bounded_probes():
    policy = SpeculationPolicy(costs(spec_ms=(200.0, 50.0)))
    record(policy, ["r0"], 4.0)
    choices = [policy.choose(candidates(1)) for _ in range(2000)]
    probes = [c for c in choices if c.head]
    assert all(c.probe for c in probes)
    plain, extra = 0.0205, 0.250 - 0.0205
    interval = min(MAX_PROBE_INTERVAL, math.ceil(extra / (PROBE_SHARE * plain)))
    assert len(probes) == len(choices) // interval
    cheaper = SpeculationPolicy(costs(spec_ms=(60.0, 10.0)))  # probes within their share of the time
    record(cheaper, ["r0"], 0.2)
    probes = sum(bool(cheaper.choose(candidates(1)).head) for _ in range(2000))
    assert 0 < probes * (0.070 - plain) <= PROBE_SHARE * 2000 * plain


def test_sequences_without_room_never_draft():
    policy = SpeculationPolicy(costs())
    record(policy, ["r0", "r1"], 3.0)
    choice = policy.choose([Candidate("r0", True, head=False), Candidate("r1", True, head=True)])
    assert choice.head == {"r1"}


def test_it_stops_when_drafts_fail_and_recovers_when_acceptance_returns():
    policy = SpeculationPolicy(costs())

    def run(steps: int, accepted: float) -> list[bool]:
        drafted = []
        for _ in range(steps):
            choice = policy.choose(candidates(1))
            drafted.append(bool(choice.head))
            if choice.head:
                policy.acceptance.record_head("r0", True, accepted)
        return drafted

    assert all(run(50, 2.0))
    failing = run(300, 0.0)
    assert sum(failing[-100:]) <= 10  # mostly plain once drafts fail: retries grow rare
    recovered = run(100, 2.0)
    assert all(recovered[50:])


def test_temperature_is_a_signal_greedy_and_sampled_requests_learn_apart():
    policy = SpeculationPolicy(costs())
    for i in range(300):
        policy.acceptance.record_head(f"g{i}", True, 2.5)
        policy.acceptance.record_head(f"s{i}", False, 0.1)
    fresh = [Candidate("new-greedy", True, head=True), Candidate("new-sampled", False, head=True)]
    assert policy.choose(fresh).head == {"new-greedy"}


def test_lookup_alone_only_where_it_pays():
    policy = SpeculationPolicy(costs(spec_ms=(200.0, 50.0)))
    for _ in range(20):
        policy.acceptance.record_lookup("r0", True, 3, 4)  # a chain of 4, 3 accepted
        policy.acceptance.record_lookup("r1", True, 0, 8)  # chains that never hold
    choice = policy.choose(candidates(2))
    assert choice.head == frozenset() and choice.lookup_alone == {"r0"}


# ---- learning from served steps

def work(request_id: str, slots: int, skip: str | None = None) -> SeqWork:
    return SeqWork(request_id, [5], 10, [0], True, slots, SamplingParams(temperature=0), [1] * 10, [2],
                   100, draft_skip_reason=skip)


def test_observed_steps_move_the_tables_and_the_acceptance():
    policy = SpeculationPolicy(costs())
    batch = ScheduledBatch([work("a", 7), work("b", 0, skip="policy")])
    result = StepResult({"a": SeqResult("a", [1, 2, 3], 7, 2), "b": SeqResult("b", [4])})
    before = policy.costs.step(2, 1)
    policy.observe(batch, result, 0.500)
    # "a" had never drafted: it owed the head its 10 tokens, so the step prices feeding, not trees
    assert policy.costs.step(2, 1) == before and policy.costs.feed > 0
    for _ in range(100):  # the same position again: "a" now owes nothing extra
        policy.observe(batch, result, 0.100)
    assert policy.costs.step(2, 1) == pytest.approx(0.100, rel=0.02) and before < 0.05
    assert policy.acceptance.head("a", True) == pytest.approx(2.0)
    plain = ScheduledBatch([work("a", 0, skip="policy"), work("b", 0, skip="policy")])
    for _ in range(100):
        policy.observe(plain, StepResult({"a": SeqResult("a", [1]), "b": SeqResult("b", [4])}), 0.010)
    assert policy.costs.step(2, 0) == pytest.approx(0.010, rel=0.02)


def test_a_head_tree_that_came_to_nothing_is_not_taken_for_a_failed_lookup_chain():
    """A grammar may forbid a whole head tree: the step verified nothing for that sequence, which
    says nothing about its context lookup."""
    policy = SpeculationPolicy(costs())
    prior = policy.acceptance.lookup("a", True)
    policy.observe(ScheduledBatch([work("a", 7)]), StepResult({"a": SeqResult("a", [1])}), 0.020)
    assert policy.acceptance.lookup("a", True) == prior and "a" not in policy.acceptance.requests
    policy.observe(ScheduledBatch([work("a", 7, skip="batch_size")]), StepResult({"a": SeqResult("a", [1, 2], 3, 1)}), 0.020)
    assert policy.acceptance.lookup("a", True) == (1.0, 3.0)


def test_owing_the_head_a_long_context_costs_what_feeding_it_costs():
    policy = SpeculationPolicy(StepCosts({1: 0.020, 8: 0.024}, {1: 0.030, 8: 0.070}, feed=0.001), max_owed=272)
    record(policy, ["new", "warm"], 1.5)
    policy.fed["warm"] = 298  # drafted at the previous step
    assert policy.choose([Candidate("new", True, head=True, context_len=300)]).head == frozenset()
    assert policy.choose([Candidate("warm", True, head=True, context_len=300)]).head == {"warm"}
    # both decoding: the one that owes little drafts, the other does not
    both = [Candidate("new", True, head=True, context_len=300), Candidate("warm", True, head=True, context_len=300)]
    assert policy.choose(both).head == {"warm"}
