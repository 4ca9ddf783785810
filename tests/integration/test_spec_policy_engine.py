"""The speculation policy in the engine: start-up costs measured on the real path, and exact
output while the choice of who drafts (head tree, lookup chain alone, nothing) and of the
trees' size changes every step."""

from __future__ import annotations

import random

import pytest

from eagle_core import SamplingParams, SpecConfig
from eagle_core.spec.policy import Choice, SpeculationPolicy
from eagle_core.step_costs import batch_sizes
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import (
    PENALISED,
    bigram_target_dir,
    chi_square_pvalue,
    exact_first_three,
    first_three_counts,
    oracle_head_dir,
)

SPEC = SpecConfig(num_draft_tokens=6, depth=3, top_k=2, lookup_tokens=4)


def shuffled(engine, seed: int):
    """Make the engine's policy draw who drafts, and the trees' size, at random each step."""
    rng = random.Random(seed)
    sizes = []

    def choose(candidates, other_rows=0):
        ids = [c.request_id for c in candidates]
        head = frozenset(c.request_id for c in candidates if c.head and rng.random() < 0.5)
        lookup = frozenset(i for i in ids if i not in head and rng.random() < 0.5)
        sizes.append(rng.randint(2, SPEC.num_draft_tokens))
        return Choice(head, lookup, 0.0, tree_nodes=sizes[-1])

    engine.chosen_sizes = sizes

    engine.policy.choose = choose
    return engine


def test_start_up_measures_the_step_costs_and_leaves_the_pool_empty(bigram):
    target, oracle = bigram
    engine = make_engine(target, draft=str(oracle), spec=SPEC, spec_max_batch=None, max_num_seqs=4)
    costs = engine.policy.costs.as_dict()
    assert sorted(costs["draft"]) == sorted(costs["level"]) == batch_sizes(4) == [1, 2, 4]
    # plain decode steps at 1, 2 and 4 rows, then the largest trees' row counts (6-node trees
    # and any lookup chains the synthetic prompts found)
    assert sorted(costs["plain"])[:3] == [1, 2, 4] and min(sorted(costs["plain"])[3:]) >= 6
    assert all(seconds > 0 for kind in ("plain", "draft") for seconds in costs[kind].values())
    assert costs["depth"] == SPEC.depth
    assert costs["feed"] >= 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert engine.worker.runner.drafter.states == {} and not engine.has_unfinished()
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = random_prompts(21, [4, 9, 15], TINY_VOCAB_SIZE)
    assert run_staggered(engine, prompts, params) == run_staggered(make_engine(target), prompts, params)
    assert engine.stats["spec_policy"]["costs"]["plain"].keys() == costs["plain"].keys()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_is_exact_while_the_choice_changes_every_step(tiny_model_dirs, tmp_path, arch):
    model_dir = tiny_model_dirs[arch]
    target = bigram_target_dir(model_dir, tmp_path / "target")
    oracle = oracle_head_dir(target, tmp_path / "oracle")
    prompts = random_prompts(22, [3 + 5 * i for i in range(10)], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = run_staggered(make_engine(target, max_num_seqs=6), prompts, params, first=6)
    engine = shuffled(make_engine(target, draft=str(oracle), spec=SPEC, spec_max_batch=None, max_num_seqs=6), 1)
    assert run_staggered(engine, prompts, params, first=6) == plain
    fallbacks = engine.stats["spec_fallbacks"]
    assert engine.stats["spec_num_drafts"] > 0 and fallbacks.get("policy", 0) > 0
    assert set(engine.chosen_sizes) == set(range(2, SPEC.num_draft_tokens + 1))
    # the served steps' accepted ranks taught the policy what every smaller tree accepts
    learned = engine.policy.acceptance.prior[True].head
    initial = SpeculationPolicy(engine.policy.costs, SPEC.num_draft_tokens).acceptance.prior[True].head
    assert all(learned[n] != initial[n] for n in range(2, SPEC.num_draft_tokens + 1))
    # the oracle's best child is accepted almost always; larger trees accept more
    assert learned[2] > 0.8 and learned[SPEC.num_draft_tokens] > learned[2] + 0.2


def test_seeded_sampling_with_penalties_is_exact_while_the_choice_changes(bigram):
    target, oracle = bigram
    prompts = random_prompts(23, [5, 11, 17, 23], TINY_VOCAB_SIZE)
    params = PENALISED
    plain = run_staggered(make_engine(target), prompts, params)
    engine = shuffled(make_engine(target, draft=str(oracle), spec=SPEC, spec_max_batch=None), 2)
    assert run_staggered(engine, prompts, params) == plain


def test_sampling_matches_the_target_distribution_while_the_choice_changes(bigram):
    target, oracle = bigram
    prompt = random_prompts(24, [6], TINY_VOCAB_SIZE)[0]
    top_k, num_samples = 3, 1500
    params = dict(temperature=1.0, top_k=top_k, max_tokens=3, ignore_eos=True)
    engine = shuffled(make_engine(target, draft=str(oracle), spec=SPEC, spec_max_batch=None, max_num_seqs=64), 3)
    counts = first_three_counts(engine, prompt, params, num_samples)
    assert chi_square_pvalue(counts, exact_first_three(target, prompt, top_k), num_samples) > 1e-3


def test_greedy_is_exact_when_drafting_restarts_past_the_feature_window(bigram):
    """A 2-feature window: prompts longer than a KV block, and sequences that skip drafting for
    a while, restart the head's context at a block boundary; output stays exact."""
    target, oracle = bigram
    prompts = random_prompts(24, [5, 20, 37, 51], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = run_staggered(make_engine(target), prompts, params)
    spec = SpecConfig(num_draft_tokens=6, depth=3, top_k=2, lookup_tokens=4, feature_window=2)
    engine = shuffled(make_engine(target, draft=str(oracle), spec=spec, spec_max_batch=None), 3)
    drafter = engine.worker.runner.drafter
    origins = []
    feed = drafter.catch_up

    def catch_up(works):
        roots = feed(works)
        origins.extend(drafter.states[request_id].origin for request_id in roots)
        return roots

    drafter.catch_up = catch_up
    assert run_staggered(engine, prompts, params) == plain
    assert max(origins) > 0 and engine.stats["spec_num_drafts"] > 0
