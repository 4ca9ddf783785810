"""The speculation policy on synthetic step costs and acceptance (no model): who drafts, and how
large a tree, as load, acceptance and costs change."""

from __future__ import annotations

import math
import random

import pytest

from eagle_core.batch import ScheduledBatch, SeqResult, SeqWork, StepResult
from eagle_core.sampling_params import SamplingParams
from eagle_core.spec.policy import (
    COST_RATE,
    MAX_PROBE_INTERVAL,
    MIN_MOVE,
    OPENING_TOKENS,
    PRIOR_RATE,
    PROBE_SHARE,
    REALIZED_BOUNDS,
    REALIZED_PRIOR_STEPS,
    REQUEST_RATE,
    Acceptance,
    Candidate,
    CostTable,
    SpeculationPolicy,
    StepCosts,
    accepted_by_size,
)

N = 8  # the configured (largest) tree


def costs(plain_ms=(20.0, 0.5), draft_ms=(4.0, 2.0), level_ms=(1.0, 0.25), sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
          depth=3) -> StepCosts:
    """Linear synthetic costs (ms): plain a + b * rows; drafting c + d * sequences for the first
    draft forward, e + f * sequences for each further one."""
    (a, b), (c, d), (e, f) = plain_ms, draft_ms, level_ms
    return StepCosts({n: (a + b * n) / 1e3 for n in sizes}, {n: (c + d * n) / 1e3 for n in sizes},
                     {n: (e + f * n) / 1e3 for n in sizes}, depth=depth)


def policy_with(c: StepCosts, **kwargs) -> SpeculationPolicy:
    return SpeculationPolicy(c, max_tree_nodes=N, **kwargs)


def candidates(n: int, greedy=True) -> list[Candidate]:
    return [Candidate(f"r{i}", greedy, head=True) for i in range(n)]


def curve(full: float) -> list[float]:
    """Accepted drafts by tree size, concave, `full` at N nodes."""
    return [0.0, 0.0] + [full * (1 - 0.6 ** (n - 1)) / (1 - 0.6 ** (N - 1)) for n in range(2, N + 1)]


def record(policy: SpeculationPolicy, request_ids, accepted: float | list[float], times=10, greedy=True):
    by_size = curve(accepted) if isinstance(accepted, (int, float)) else accepted
    for _ in range(times):
        for request_id in request_ids:
            policy.acceptance.record_head(request_id, greedy, by_size, range(2, N + 1))


# ---- the cost table

def test_cost_table_interpolates_extrapolates_and_follows_observations():
    table = CostTable({1: 1.0, 4: 4.0, 8: 6.0})
    assert table(0) == 1.0 and table(2) == pytest.approx(2.0) and table(6) == pytest.approx(5.0)
    assert table(10) == pytest.approx(7.0)  # the last segment's slope
    for _ in range(200):
        table.observe(2, 3.0)
    assert table(2) == pytest.approx(3.0, rel=1e-3)
    assert table(8) / table(4) == pytest.approx(6.0 / 4.0)  # a later point keeps its ratio


def test_a_step_costs_its_rows_at_plain_prices_plus_the_draft_forwards_its_trees_take():
    c = costs()
    assert c.step(4, 0) == pytest.approx(0.022)
    assert c.step(4 + 4 * 7, 4) == pytest.approx(0.036 + 0.012 + 2 * 0.002)  # four full trees: 3 forwards
    assert c.step(4 + 1 * 2, 1, tree_nodes=3) == pytest.approx(0.023 + 0.006 + 0.00125)  # 2 forwards
    assert c.step(2, 1, tree_nodes=2) == pytest.approx(0.021 + 0.006)  # 1 forward
    assert c.forwards(2) == 1 and c.forwards(4) == 3 and c.forwards(8) == 3 and c.forwards(None) == 3


def test_observed_drafting_steps_share_the_miss_between_the_first_forward_and_the_levels():
    c = costs()
    for _ in range(300):
        c.observe(4 + 4 * 7, 4, 0.036 + 0.030 + 2 * 0.006, tree_nodes=N)  # full trees: both parts dearer
        c.observe(4 + 4, 4, 0.024 + 0.030, tree_nodes=2)  # 2-node trees: the first forward alone
    assert c.draft(4) == pytest.approx(0.030, rel=0.02) and c.level(4) == pytest.approx(0.006, rel=0.05)
    assert c.plain(4) == pytest.approx(0.022)  # plain prices move only with plain steps


# ---- what smaller trees would have accepted

def test_a_path_tells_what_every_smaller_tree_would_have_accepted():
    # the accepted path's nodes ranked 1, 3 and 6 in the step's score order
    assert accepted_by_size([1, 3, 6], 8) == [0, 0, 1, 1, 2, 2, 2, 3, 3]
    # a lookup node (rank 0) would be there with any tree; a head node after it keeps its rank
    assert accepted_by_size([0, 0, 5], 6) == [0, 0, 2, 2, 2, 2, 3]
    assert accepted_by_size([], 4) == [0] * 5


# ---- choices

def test_it_drafts_less_as_load_grows():
    policy = policy_with(costs())
    record(policy, [f"r{i}" for i in range(32)], 1.5)
    drafting = [len(policy.choose(candidates(n)).head) for n in (1, 2, 4, 8, 16, 32)]
    assert drafting[0] == 1 and drafting[-1] == 0
    assert [k / n for k, n in zip(drafting, (1, 2, 4, 8, 16, 32))] == sorted(
        (k / n for k, n in zip(drafting, (1, 2, 4, 8, 16, 32))), reverse=True)


def test_trees_shrink_as_load_grows_and_grow_where_rows_are_cheap():
    """Each extra node is worth less than the last (a concave acceptance curve): a batch of one,
    whose rows cost little, verifies the full tree; a loaded step only the best few nodes."""
    policy = policy_with(costs(plain_ms=(20.0, 0.25), draft_ms=(4.0, 1.0)))
    record(policy, [f"r{i}" for i in range(16)], 2.5)
    sizes = {}
    for batch in (1, 2, 4, 8, 16):
        choice = policy.choose(candidates(batch))
        assert len(choice.head) == batch
        sizes[batch] = choice.tree_nodes
    assert sizes[1] == N and 2 <= sizes[16] < sizes[4] <= sizes[1]
    assert list(sizes.values()) == sorted(sizes.values(), reverse=True)
    # rows four times as dear: a smaller tree at batch 1 too
    dear = policy_with(costs(plain_ms=(20.0, 1.0), draft_ms=(4.0, 1.0)))
    record(dear, ["r0"], 2.5)
    assert dear.choose(candidates(1)).tree_nodes < N


def test_a_pinned_size_is_the_only_size():
    policy = policy_with(costs(plain_ms=(20.0, 1.0), draft_ms=(4.0, 1.0)), choose_size=False)
    record(policy, [f"r{i}" for i in range(16)], 2.5)
    assert {policy.choose(candidates(b)).tree_nodes for b in (1, 16)} == {N}


def test_it_drafts_more_as_acceptance_rises():
    counts = []
    for accepted in (0.1, 0.5, 1.0, 2.0, 4.0):
        policy = policy_with(costs())
        record(policy, [f"r{i}" for i in range(4)], accepted)
        counts.append(len(policy.choose(candidates(4)).head))
    assert counts[0] == 0 and counts[-1] == 4 and counts == sorted(counts)


def test_the_requests_that_accept_most_draft_first():
    policy = policy_with(costs())
    record(policy, ["r0", "r2"], 0.0)
    record(policy, ["r1", "r3"], 3.0)
    assert policy.choose(candidates(4)).head == {"r1", "r3"}


def test_nothing_drafts_where_drafting_cannot_pay_except_bounded_full_tree_probes():
    policy = policy_with(costs(draft_ms=(200.0, 50.0)))
    record(policy, ["r0"], 4.0)
    choices = [policy.choose(candidates(1)) for _ in range(2000)]
    probes = [c for c in choices if c.head]
    assert all(c.probe and c.tree_nodes == N for c in probes)
    plain = policy.costs.step(1, 0)
    extra = policy.costs.step(N, 1) - plain
    interval = min(MAX_PROBE_INTERVAL, math.ceil(extra / (PROBE_SHARE * plain)))
    assert len(probes) == len(choices) // interval
    cheaper = policy_with(costs(draft_ms=(40.0, 10.0)))  # probes within their share of the time
    record(cheaper, ["r0"], 0.2)
    probes = sum(bool(cheaper.choose(candidates(1)).head) for _ in range(2000))
    assert 0 < probes * (cheaper.costs.step(N, 1) - plain) <= PROBE_SHARE * 2000 * plain


def test_probes_keep_to_their_share_with_what_the_probing_sequence_owes_the_head():
    """A sequence that has not drafted for a while feeds the head what it owes in its probe: the
    probe interval counts that feeding too."""
    c = costs(draft_ms=(20.0, 5.0))
    c.feed = 0.2e-3  # s per owed entry: 256 owed entries cost 2.5 plain steps
    policy = policy_with(c)
    record(policy, ["r0"], 0.2)
    owing = [Candidate("r0", True, head=True, context_len=260)]
    probes = [c for c in (policy.choose(owing) for _ in range(4000)) if c.head]
    plain = policy.costs.step(1, 0)
    extra = policy.costs.step(N, 1, owed=256) - plain
    assert probes and len(probes) * extra <= PROBE_SHARE * 4000 * plain


def test_beside_a_prefill_a_draft_must_beat_the_plain_decode_rate_not_the_prefill_steps():
    """A prefill makes the step slow: its own tokens per second are low, and beside them a draft
    that plain decoding would beat looks cheap. Counting the prefill's time at the plain
    decode rate leaves the decision to the drafts' own price."""
    c = costs(plain_ms=(20.0, 0.5), draft_ms=(4.0, 2.0))
    policy = policy_with(c)
    record(policy, [f"r{i}" for i in range(8)], 0.6)  # too little to pay decoding plainly
    assert not policy.choose(candidates(8)).head
    beside_prefill = policy.choose(candidates(8), other_rows=400)
    assert not beside_prefill.head
    # the same step valued at its own (prefill-slowed) rate would have drafted
    own_rate = 8 / c.step(408, 0)
    gain = max(policy.acceptance.head(f"r{i}", True)[N] for i in range(8))  # the best one drafting
    assert (8 + gain) / c.step(408 + N - 1, 1) > own_rate
    record(policy, [f"r{i}" for i in range(8)], 4.0)  # drafts that pay decoding plainly pay here too
    assert policy.choose(candidates(8), other_rows=400).head


def test_sequences_without_room_never_draft():
    policy = policy_with(costs())
    record(policy, ["r0", "r1"], 3.0)
    choice = policy.choose([Candidate("r0", True, head=False), Candidate("r1", True, head=True)])
    assert choice.head == {"r1"}


def test_it_stops_when_drafts_fail_and_recovers_when_acceptance_returns():
    policy = policy_with(costs())

    def run(steps: int, accepted: float) -> list[bool]:
        drafted = []
        for _ in range(steps):
            choice = policy.choose(candidates(1))
            drafted.append(bool(choice.head))
            if choice.head:
                policy.acceptance.record_head("r0", True, curve(accepted), range(2, choice.tree_nodes + 1))
        return drafted

    assert all(run(50, 2.0))
    failing = run(300, 0.0)
    assert sum(failing[-100:]) <= 10  # mostly plain once drafts fail: retries grow rare
    recovered = run(100, 2.0)
    assert all(recovered[50:])


def test_temperature_is_a_signal_greedy_and_sampled_requests_learn_apart():
    policy = policy_with(costs())
    for i in range(300):
        policy.acceptance.record_head(f"g{i}", True, curve(2.5), range(2, N + 1))
        policy.acceptance.record_head(f"s{i}", False, curve(0.1), range(2, N + 1))
    fresh = [Candidate("new-greedy", True, head=True), Candidate("new-sampled", False, head=True)]
    assert policy.choose(fresh).head == {"new-greedy"}


def test_a_head_tree_is_priced_with_the_lookup_chain_grafted_onto_it():
    """Where the worker grafts each drafting sequence's lookup chain onto its tree, a 2-node
    tree verifies the chain's rows too: the step costs them, and a gain that paid for one row
    does not pay for nine."""
    def choice(grafts: bool):
        policy = policy_with(costs(plain_ms=(20.0, 2.0)), grafts=grafts, lookup=False)
        record(policy, ["r0"], [0.0, 0.0] + [0.6] * (N - 1))  # 0.6 accepted whatever the size
        for _ in range(20):
            policy.acceptance.record_lookup("r0", True, 0, 8)  # chains of 8 rows
        return policy.choose([Candidate("r0", True, head=True)])

    plain_only = choice(grafts=False)
    assert plain_only.head == {"r0"} and plain_only.tree_nodes == 2
    grafted = choice(grafts=True)
    assert grafted.head == frozenset()


def test_lookup_alone_only_where_it_pays():
    policy = policy_with(costs(draft_ms=(200.0, 50.0)))
    for _ in range(20):
        policy.acceptance.record_lookup("r0", True, 3, 4)  # a chain of 4, 3 accepted
        policy.acceptance.record_lookup("r1", True, 0, 8)  # chains that never hold
    choice = policy.choose(candidates(2))
    assert choice.head == frozenset() and choice.lookup_alone == {"r0"}


# ---- learning from served steps

def work(request_id: str, slots: int, skip: str | None = None, output_len: int = OPENING_TOKENS) -> SeqWork:
    """A decode step with `slots` draft slots, all of them the head tree's unless `skip`, of a
    request that has answered `output_len` tokens (past the opening unless told)."""
    return SeqWork(request_id, [5], 10, [0], True, slots, SamplingParams(temperature=0), [1] * 10, [2] * output_len,
                   100, num_tree_slots=0 if skip else slots, draft_skip_reason=skip)


def test_observed_steps_move_the_tables_and_the_acceptance_of_every_smaller_tree():
    policy = policy_with(costs())
    batch = ScheduledBatch([work("a", 7), work("b", 0, skip="policy")])
    drafted = SeqResult("a", [1, 2, 3], 7, 2, accepted_ranks=[1, 3])
    result = StepResult({"a": drafted, "b": SeqResult("b", [4])})
    before = policy.costs.step(9, 1)  # 8 tree rows + b's
    policy.observe(batch, result, 0.500)
    # "a" had never drafted: it owed the head its 10 tokens, so the step prices feeding, not trees
    assert policy.costs.step(9, 1) == before and policy.costs.feed > 0
    for _ in range(100):  # the same position again: "a" now owes nothing extra
        policy.observe(batch, result, 0.100)
    assert policy.costs.step(9, 1) == pytest.approx(0.100, rel=0.02) and before < 0.05
    assert policy.acceptance.head("a", True)[2:] == pytest.approx([1, 1, 2, 2, 2, 2, 2])
    plain = ScheduledBatch([work("a", 0, skip="policy"), work("b", 0, skip="policy")])
    for _ in range(100):
        policy.observe(plain, StepResult({"a": SeqResult("a", [1]), "b": SeqResult("b", [4])}), 0.010)
    assert policy.costs.step(2, 0) == pytest.approx(0.010, rel=0.02)


def drafting_steps(policy: SpeculationPolicy, accepted_ranks: list[int], steps: int = 60, slower: float = 1.0) -> list[bool]:
    """Each step a new request whose own average says 3 drafts at the full tree (the highest
    of many noisy averages, as choosing the best candidates finds them) decodes alone; a step
    that drafts accepts the drafts of `accepted_ranks` and takes `slower` times its forecast.
    Whether each step drafted."""
    drafted = []
    for i in range(steps):
        request_id = f"q{i}"
        record(policy, [request_id], 3.0, times=1)
        choice = policy.choose([Candidate(request_id, True, head=True)])
        drafted.append(bool(choice.head))
        if choice.head:
            n = choice.tree_nodes
            accepted = [rank for rank in accepted_ranks if rank < n]
            result = SeqResult(request_id, [1] * (1 + len(accepted)), n - 1, len(accepted), accepted_ranks=accepted)
            policy.observe(ScheduledBatch([work(request_id, n - 1)]), StepResult({request_id: result}), slower * choice.seconds)
        else:
            policy.observe(ScheduledBatch([work(request_id, 0, skip="policy")]), StepResult({request_id: SeqResult(request_id, [1])}), choice.seconds)
    return drafted


def test_drafting_that_yields_less_than_forecast_stops():
    """Drafts accepted as forecast: every step drafts. Nothing accepted where 3 drafts were
    forecast: the realized share scales the forecasts down until plain decoding wins, probes
    aside."""
    policy = policy_with(costs(), lookup=False)
    assert all(drafting_steps(policy, [1, 2, 3]))
    assert policy._realized(1).tokens == pytest.approx(1.0, abs=0.35) and policy._realized(1).time == pytest.approx(1.0)
    policy = policy_with(costs(), lookup=False)
    drafted = drafting_steps(policy, [])
    assert drafted[0] and sum(drafted[-30:]) <= 8
    assert policy._realized(1).tokens < 0.5


def test_what_loaded_steps_realize_leaves_a_lone_sequence_alone():
    """Ranking 16 candidates picks lucky averages; one candidate has none to pick from: the
    ratios are kept by load, so loaded steps that realized nothing still let batch 1 draft."""
    policy = policy_with(costs(), lookup=False)
    for _ in range(50):
        policy._realized(16).observe(10.0, 0.0, 0.1, 0.1)
    record(policy, ["r0"], 3.0)
    assert policy.choose([Candidate("r0", True, head=True)]).head == {"r0"}
    assert policy._realized(1).tokens == 1.0 and policy._realized(31).tokens == REALIZED_BOUNDS[0]


def test_drafting_steps_slower_than_forecast_stop_where_the_margin_was_thin():
    """A tree of 1.3 accepted drafts at batch 1 pays on the tables; steps twice as slow as
    forecast (rows the choice did not see) do not, and the policy learns it."""
    policy = policy_with(costs(), lookup=False)
    assert sum(drafting_steps(policy, [1], slower=1.0)[-30:]) >= 25
    policy = policy_with(costs(), lookup=False)
    assert sum(drafting_steps(policy, [1], slower=2.0)[-30:]) <= 8
    assert 1.5 < policy._realized(1).time <= 2.0  # 2 once the start's come-true steps have decayed


def test_a_tree_of_unknown_ranks_tells_only_its_own_size():
    policy = policy_with(costs())
    prior = list(policy.acceptance.head("a", True))
    policy.observe(ScheduledBatch([work("a", 4)]), StepResult({"a": SeqResult("a", [1, 2, 3], 4, 2)}), 0.020)
    own = policy.acceptance.head("a", True)
    assert own[5] == pytest.approx(prior[5] + REQUEST_RATE * (2 - prior[5]))
    assert own[:5] == prior[:5] and own[6:] == prior[6:]


def test_a_head_tree_that_came_to_nothing_is_not_taken_for_a_failed_lookup_chain():
    """A grammar may forbid a whole head tree: the step verified nothing for that sequence, which
    says nothing about its context lookup."""
    policy = policy_with(costs())
    prior = policy.acceptance.lookup("a", True)
    policy.observe(ScheduledBatch([work("a", 7)]), StepResult({"a": SeqResult("a", [1])}), 0.020)
    assert policy.acceptance.lookup("a", True) == prior and "a" not in policy.acceptance.requests
    policy.observe(ScheduledBatch([work("a", 7, skip="batch_size")]), StepResult({"a": SeqResult("a", [1, 2], 3, 1)}), 0.020)
    accepted, rows = prior
    assert policy.acceptance.lookup("a", True) == pytest.approx(
        (accepted + REQUEST_RATE * (1 - accepted), rows + REQUEST_RATE * (3 - rows)))


def test_a_first_drafting_step_that_accepted_nothing_does_not_stop_a_request_drafting():
    """One step says little: a request's own averages start at the average over requests and
    move by REQUEST_RATE, and `Realization` starts as if its first forecasts had come true, so
    one unlucky step leaves drafting chosen where the averages say it pays."""
    policy = policy_with(costs(), lookup=False)
    record(policy, ["old"], 2.0, times=60)  # earlier requests accepted 2 drafts at the full tree
    choice = policy.choose([Candidate("a", True, head=True)])
    assert choice.head == {"a"}
    n = choice.tree_nodes
    policy.observe(ScheduledBatch([work("a", n - 1)]), StepResult({"a": SeqResult("a", [1], n - 1, 0, accepted_ranks=[])}),
                   choice.seconds)
    assert policy._realized(1).tokens == pytest.approx(REALIZED_PRIOR_STEPS / (REALIZED_PRIOR_STEPS + 1), rel=0.05)
    assert policy.choose([Candidate("a", True, head=True)]).head == {"a"}


def test_drafting_steps_in_an_answers_opening_are_not_recorded():
    """Before an answer has OPENING_TOKENS tokens its drafts are hardest: those steps move
    neither the request's averages nor those over requests; later steps do."""
    policy = policy_with(costs(), lookup=False)
    prior = list(policy.acceptance.head("a", True))
    failed = StepResult({"a": SeqResult("a", [1], 7, 0, accepted_ranks=[])})
    policy.observe(ScheduledBatch([work("a", 7, output_len=OPENING_TOKENS - 1)]), failed, 0.030)
    assert "a" not in policy.acceptance.requests and policy.acceptance.head("b", True) == prior
    policy.observe(ScheduledBatch([work("a", 7, output_len=OPENING_TOKENS)]), failed, 0.030)
    assert policy.acceptance.head("a", True)[N] == pytest.approx((1 - REQUEST_RATE) * prior[N])
    assert policy.acceptance.head("b", True)[N] < prior[N]


def test_owing_the_head_a_long_context_costs_what_feeding_it_costs():
    policy = policy_with(StepCosts({1: 0.020, 8: 0.024}, {1: 0.010, 8: 0.050}, feed=0.001), max_owed=272)
    record(policy, ["new", "warm"], 1.5)
    policy.fed["warm"] = 298  # drafted at the previous step
    assert policy.choose([Candidate("new", True, head=True, context_len=300)]).head == frozenset()
    assert policy.choose([Candidate("warm", True, head=True, context_len=300)]).head == {"warm"}
    # both decoding: the one that owes little drafts, the other does not
    both = [Candidate("new", True, head=True, context_len=300), Candidate("warm", True, head=True, context_len=300)]
    assert policy.choose(both).head == {"warm"}


def test_small_trees_are_checked_against_the_largest_now_and_then():
    """While smaller trees are chosen, a bounded share of drafting steps drafts the largest, so
    estimates for sizes not chosen stay measured."""
    policy = policy_with(costs(plain_ms=(20.0, 2.0), draft_ms=(4.0, 1.0)))
    record(policy, ["r0"], 2.5)
    choices = [policy.choose(candidates(1)) for _ in range(1000)]
    small = [c for c in choices if not c.probe]
    probes = [c for c in choices if c.probe]
    assert small and all(c.tree_nodes < N for c in small)
    assert probes and all(c.tree_nodes == N and c.head == {"r0"} for c in probes)
    seconds = policy.costs.step(1 + small[0].tree_nodes - 1, 1, tree_nodes=small[0].tree_nodes)
    extra = policy.costs.step(N, 1) - seconds
    assert len(probes) * extra <= PROBE_SHARE * len(choices) * seconds * 1.01


# ---- the start-up tables

def test_start_up_tables_follow_by_difference_and_extend_the_plain_table_to_tree_rows():
    from eagle_core.step_costs import _tables

    def ms(x):
        return x / 1e3

    # plain 10 ms + 1 ms a row; the first draft forward 5 ms, each further one 2 ms; 8-node trees
    medians = {
        k: {None: (ms(10 + k), k), 2: (ms(10 + 2 * k + 5), 2 * k), 3: (ms(10 + 3 * k + 5 + 2), 3 * k),
            8: (ms(10 + 8 * k + 5 + 2 * 2), 8 * k)}
        for k in (1, 2, 4)
    }
    c = _tables(medians, depth=3)
    assert c.draft.as_dict() == pytest.approx({1: ms(5), 2: ms(5), 4: ms(5)})
    assert c.level.as_dict() == pytest.approx({1: ms(2), 2: ms(2), 4: ms(2)})
    # points past the plain decode steps' 4 rows, from the largest trees' steps
    assert sorted(c.plain.as_dict()) == [1, 2, 4, 8, 16, 32]
    assert c.plain(32) == pytest.approx(ms(42)) and c.step(4 + 4 * 7, 4) == pytest.approx(medians[4][8][0])


def test_points_past_an_observed_count_keep_their_ratio_to_it():
    """Plain steps observe decode row counts only; the larger counts trees reach (measured at
    start-up on short contexts) follow them, so they never look cheaper than fewer rows."""
    table = CostTable({8: 0.020, 32: 0.040, 64: 0.065, 128: 0.110})
    for _ in range(200):
        table.observe(32, 0.080)  # longer contexts: twice the start-up price
    assert table(32) == pytest.approx(0.080, rel=1e-3)
    assert table(64) == pytest.approx(0.130, rel=1e-2) and table(128) == pytest.approx(0.220, rel=1e-2)
    assert table(8) < 0.05  # below: only its share of the bracket moved


def test_noise_larger_than_a_point_moves_neither_it_nor_the_points_past_it_far():
    """A drafting sequence's first forward is ~1 ms of a step whose noise is several: the point
    follows the observations' middle, and the larger counts keep their ratio to it."""
    rng = random.Random(0)
    table = CostTable({1: 0.00125, 4: 0.002, 8: 0.0052, 32: 0.029})
    for _ in range(3000):
        table.observe(1, rng.gauss(0.00125, 0.005))
    assert 0.0006 < table(1) < 0.0025
    assert table(8) / table(1) == pytest.approx(0.0052 / 0.00125, rel=1e-6)
    assert 0.0026 < table(8) < 0.0104 and 0.0145 < table(32) < 0.058


def test_a_point_near_the_floor_does_not_ratchet_the_points_past_it():
    """A level table whose first point start-up measured as ~0 (a difference of noisy steps),
    observed with noise many times its size: the larger counts stay within what the first
    point's own moves at or above MIN_MOVE can justify, not the seconds the floor's uneven
    falls and rises once ratcheted them to."""
    rng = random.Random(0)
    table = CostTable({1: 1e-6, 2: 0.00077, 4: 0.00077, 8: 0.00077, 16: 0.008, 32: 0.009})
    for _ in range(5000):
        table.observe(1, rng.gauss(0.0005, 0.003))
    ratio = max(table(1), MIN_MOVE) / MIN_MOVE  # how far the first point rose past MIN_MOVE
    assert table(2) <= 0.00077 * ratio * (1 + 1e-9) and table(32) <= 0.009 * ratio * (1 + 1e-9)
    assert table(2) < 0.02 and table(32) < 0.2


@pytest.mark.parametrize("outlier", [10.0, -10.0])
def test_one_outlier_step_moves_no_point_by_more_than_the_rate(outlier):
    """A step stalled by a pause of the process (or timed across a clock hiccup) is one
    observation: once the point has been observed as often as its rate needs, no point,
    observed or past it, moves by more than a factor 1 + COST_RATE; before that, by at most
    1 + 1 / (observations + 2)."""
    points = {1: 0.018, 2: 0.020, 4: 0.021, 8: 0.026, 16: 0.041, 32: 0.055}
    table = CostTable(points)
    table.observe(1, outlier)
    for x, before in points.items():
        assert before / 1.5 - 1e-12 <= table(x) <= before * 1.5 + 1e-12
    table = CostTable(points)
    for _ in range(round(1 / COST_RATE) - 2):
        table.observe(1, points[1])
    table.observe(1, outlier)
    for x, before in points.items():
        assert before / (1 + COST_RATE) - 1e-12 <= table(x) <= before * (1 + COST_RATE) + 1e-12


@pytest.mark.parametrize("carry_rises", [True, False])
def test_a_disturbed_start_up_point_is_soon_replaced_by_what_steps_cost(carry_rises):
    """Start-up measured drafting at 14x its cost (another process ran meanwhile): a point's
    first observations weigh like its start-up value, so a few of them bring it near the truth,
    where COST_RATE's steady moves alone would take nearly twice as many. The points past it,
    disturbed alike, follow its fall in either kind of table."""
    table = CostTable({1: 0.0627, 4: 0.070}, carry_rises=carry_rises)
    steady = 0.0627
    for _ in range(10):
        table.observe(1, 0.0044)
        steady = max(steady + COST_RATE * (0.0044 - steady), steady / (1 + COST_RATE))
    assert table(1) < 0.012 and steady > 0.024
    assert table(4) == pytest.approx(0.070 * table(1) / 0.0627)  # the point past it followed


def test_a_draft_point_start_up_measured_low_rises_alone():
    """A draft table's point is a difference of measured steps: one that noise made low at
    start-up rises to its truth without lifting the larger counts (which, priced too high, would
    never be chosen and so never corrected); its moves below the start-up value still carry."""
    table = CostTable({1: 0.00053, 2: 0.00315, 16: 0.009}, carry_rises=False)
    for _ in range(300):
        table.observe(1, 0.0022)
    assert table(1) == pytest.approx(0.0022, rel=1e-3)
    assert table(2) == 0.00315 and table(16) == 0.009
    for _ in range(300):
        table.observe(1, 0.00053 / 2)  # now half its start-up value: the larger counts follow
    assert table(2) == pytest.approx(0.00315 / 2, rel=1e-2) and table(16) == pytest.approx(0.009 / 2, rel=1e-2)
    carried = CostTable({1: 0.00053, 2: 0.00315, 16: 0.009})  # a plain table's points follow every move
    for _ in range(300):
        carried.observe(1, 0.0022)
    assert carried(2) == pytest.approx(0.00315 * 0.0022 / 0.00053, rel=1e-2)


def test_only_the_plain_table_carries_rises_to_larger_counts():
    c = costs()
    assert c.plain.carry_rises and not c.draft.carry_rises and not c.level.carry_rises
    for _ in range(300):  # one sequence drafting full trees, dearer than start-up priced it
        c.observe(1 + 7, 1, 0.024 + 0.007 + 2 * 0.00146, tree_nodes=N)
    assert c.draft(1) > 0.0068 and c.level(1) > 0.0014  # from 0.006 and 0.00125
    assert c.draft(2) == pytest.approx(0.008) and c.level(2) == pytest.approx(0.0015)  # their start-up prices


def test_more_never_costs_less():
    table = CostTable({1: 0.035, 2: 0.037, 4: 0.031, 8: 0.042})  # a noisy start-up median at 4
    assert table(4) == table(2) == 0.037 and table(3) == 0.037
    for _ in range(100):
        table.observe(1, 0.040)
    assert table.as_dict()[2] >= table(1) and table(4) >= table(2)


def test_the_averages_over_requests_are_the_mean_of_their_first_steps_then_move_at_the_prior_rate():
    """Where drafts are seldom chosen (sampled requests), the few steps measured must replace
    the initial guess, not nudge it by PRIOR_RATE each."""
    acceptance = Acceptance(N)
    initial = list(acceptance.prior[False].head)
    steps = [0.0, 0.0, 0.3, 0.4, 0.45, 0.48, 0.5, 0.5, 0.5]
    for i in range(5):
        acceptance.record_head(f"r{i}", False, steps, range(2, N + 1))
    for n in range(2, N + 1):
        assert acceptance.prior[False].head[n] == pytest.approx((initial[n] + 5 * steps[n]) / 6)
    assert acceptance.prior[True].head == initial  # greedy requests learn apart
    acceptance.record_lookup("r0", False, 0, 4)
    assert acceptance.prior[False].lookup == pytest.approx(0.25)  # the mean of 0.5 (initial) and 0
    for i in range(200):
        acceptance.record_head(f"s{i}", False, steps, range(2, N + 1))
    before = acceptance.prior[False].head[2]
    acceptance.record_head("late", False, [0.0, 0.0, 1.3] + steps[3:], range(2, N + 1))
    assert acceptance.prior[False].head[2] - before == pytest.approx(PRIOR_RATE * (1.3 - before))
