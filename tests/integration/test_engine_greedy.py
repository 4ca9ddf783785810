"""Greedy decoding through the engine equals transformers' generate(), token for token."""

from __future__ import annotations

import pytest

from eagle_core import SamplingParams
from tests.engine_helpers import hf_greedy, make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE

LENGTHS = [3, 17, 40, 100, 5, 9, 64, 33, 250, 1]
MAX_NEW = 24


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "qwen3"])
def test_greedy_matches_transformers_generate(tiny_model_dirs, arch):
    model_dir = tiny_model_dirs[arch]
    # A small step budget forces the 250-token prompt through several prefill chunks while
    # others decode; half the prompts join after the first ones are already decoding.
    engine = make_engine(model_dir, max_num_batched_tokens=64)
    prompts = random_prompts(1, LENGTHS, TINY_VOCAB_SIZE)
    outputs = run_staggered(engine, prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW), first=5)
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(model_dir, prompt, MAX_NEW, set(engine.eos_token_ids))
        assert outputs[str(i)] == expected, f"{arch} prompt {i} (length {len(prompt)}) diverged"


def test_decoding_requests_share_one_forward_per_step(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    prompts = random_prompts(2, [5, 8, 13, 21, 34, 3, 7, 11], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    engine.step()  # all eight prompts prefill together (103 tokens < the step budget)
    assert engine.num_running == 8
    target = engine.worker.target
    for _ in range(10):
        before = target.num_forwards
        outputs = engine.step()
        assert target.num_forwards == before + 1
        assert sorted(len(o.new_token_ids) for o in outputs) == [1] * 8  # every request advanced


def test_tiny_kv_budget_preempts_and_still_matches(tiny_llama_dir):
    prompts = random_prompts(3, [30, 45, 20, 60, 25, 50], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    roomy = run_staggered(make_engine(tiny_llama_dir), prompts, params)
    # 8 blocks of 16 tokens hold two or three of these sequences, so newer ones get preempted.
    tight_engine = make_engine(tiny_llama_dir, kv_tokens=128, max_model_len=112, max_num_batched_tokens=64)
    tight = run_staggered(tight_engine, prompts, params)
    assert tight_engine.scheduler.num_preemptions > 0
    assert tight == roomy
    assert tight_engine.block_manager.num_free_blocks == tight_engine.block_manager.num_blocks
