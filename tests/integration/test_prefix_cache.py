"""Prefix caching changes no output: greedy fp32 text is identical with the cache on and off, with
and without speculation, on two architectures, through hits on blocks running sequences share,
second turns that reuse a first turn's answer, eviction and preemption."""

from __future__ import annotations

import pytest

from eagle_core import SamplingParams, SpecConfig
from eagle_core.spec.drafter import Drafter
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import random_head_dir

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def two_turns(engine) -> dict[str, list[int]]:
    """First turns sharing a 40-token system prompt, joined while the first ones run; then
    second turns: each first turn's prompt and answer followed by a new message. Also records
    the tokens the first turns found cached (engine.first_turns_cached)."""
    system = random_prompts(1, [40], TINY_VOCAB_SIZE)[0]
    messages = random_prompts(2, [5 + 6 * i for i in range(6)], TINY_VOCAB_SIZE)
    first_prompts = [system + m for m in messages]
    first = run_staggered(engine, first_prompts, PARAMS, first=2)
    engine.first_turns_cached = engine.scheduler.num_cached_tokens
    follow_ups = random_prompts(3, [7] * 6, TINY_VOCAB_SIZE)
    second_prompts = [first_prompts[i] + first[str(i)] + follow_ups[i] for i in range(6)]
    second = run_staggered(engine, second_prompts, PARAMS, first=3)
    return {f"first-{k}": v for k, v in first.items()} | {f"second-{k}": v for k, v in second.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("speculation", [False, True])
def test_outputs_are_identical_with_the_cache_on_and_off(tiny_model_dirs, tmp_path, monkeypatch, arch, speculation):
    model_dir = tiny_model_dirs[arch]
    draft = str(random_head_dir(model_dir, tmp_path / "head")) if speculation else None
    spec = SpecConfig(num_draft_tokens=8, depth=3, top_k=3, lookup_tokens=4)
    proposals: dict[tuple[str, int], list[int]] = {}  # (request, root position) -> the head's tree
    build_trees = Drafter.build_trees

    def recording(self, works, *args):
        trees = build_trees(self, works, *args)
        for work, tree in zip(works, trees):
            proposals[(work.request_id, work.start_pos)] = tree.token_ids[0].tolist()
        return trees

    monkeypatch.setattr(Drafter, "build_trees", recording)
    outputs, engines, proposed = {}, {}, {}
    for caching in (False, True):
        engines[caching] = make_engine(model_dir, draft=draft, spec=spec, prefix_caching=caching, max_num_seqs=4)
        outputs[caching] = two_turns(engines[caching])
        proposed[caching], proposals = proposals, {}
    assert outputs[True] == outputs[False]
    on, off = engines[True].scheduler, engines[False].scheduler
    assert off.num_cached_tokens == 0
    # Every first turn after the first two hits the system prompt's two full blocks, whole with a
    # draft head too (the head resumes past them: the first two turns fed it their prompts).
    assert engines[True].first_turns_cached >= 4 * 16 * 2
    # Every second turn hits at least its first turn's prompt blocks; with a draft head, less the
    # last where the first turn ended before the head was fed it (computed again, so that the
    # head keeps its cached context).
    drafting = 1 if speculation else 0
    assert on.num_cached_tokens >= 4 * 16 * 2 + sum(((45 + 6 * i) // 16 - drafting) * 16 for i in range(6))
    if speculation:
        # The head attends to the cached prefixes' draft entries: it proposes what it proposes
        # without the cache (a random head's proposals change with what it attends to).
        assert proposed[True] == proposed[False]
        assert engines[True].spec_counters.as_dict() == engines[False].spec_counters.as_dict()


@pytest.mark.parametrize("speculation", [False, True])
def test_identical_through_eviction_and_preemption(tiny_model_dirs, tmp_path, speculation):
    """A KV pool of 14 blocks for 4 sequences of up to ~110 tokens: sequences are preempted and
    come back through their own cached blocks, and freed cached blocks are evicted."""
    model_dir = tiny_model_dirs["llama"]
    draft = str(random_head_dir(model_dir, tmp_path / "head")) if speculation else None
    spec = SpecConfig(num_draft_tokens=4, depth=2, top_k=2)
    outputs, engines = {}, {}
    for caching in (False, True):
        engines[caching] = make_engine(model_dir, draft=draft, spec=spec, prefix_caching=caching, kv_tokens=224,
                                       max_num_seqs=4, max_model_len=192)
        outputs[caching] = two_turns(engines[caching])
    assert outputs[True] == outputs[False]
    on = engines[True]
    assert on.scheduler.num_preemptions > 0
    assert on.block_manager.num_evictions > 0
    assert on.scheduler.num_cached_tokens > 0
