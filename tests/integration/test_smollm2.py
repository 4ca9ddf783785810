"""The real default model (SmolLM2-135M-Instruct, fp32): the engine against transformers, and
speculation against plain decoding. A divergence is accepted only at a near-tie."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from eagle_core import SamplingParams, SpecConfig
from tests.engine_helpers import hf_greedy, make_engine, run_staggered, top2_gap
from tests.spec_helpers import random_head_dir

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "List three primary colors.",
    "hi",
    "Translate 'good morning' into Spanish and German, then explain the difference in formality between the two greetings.",
    "What is 17 times 23?",
    "Give me a haiku about autumn leaves falling on a quiet river at dusk.",
    "Name a famous physicist.",
    "Summarise the plot of Romeo and Juliet.",
    "Why is the sky blue?",
    "Write a limerick about a cat.",
]
MAX_NEW = 24


def chat_prompts(model_dir, questions):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)["input_ids"])
        for q in questions
    ]


def assert_same_or_near_tie(model_dir, prompt, got, expected, what):
    if got == expected:
        return
    i = next(k for k in range(min(len(got), len(expected))) if got[k] != expected[k])
    gap = top2_gap(model_dir, prompt + expected[:i])
    assert gap < 1e-3, f"{what}: diverged at token {i} where the top-2 logit gap is {gap:.2e}"


def test_greedy_matches_transformers_generate(smollm2_dir):
    prompts = chat_prompts(smollm2_dir, QUESTIONS[:9])
    engine = make_engine(smollm2_dir, max_model_len=2048, max_num_batched_tokens=128)
    outputs = run_staggered(engine, prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW), first=4)
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(smollm2_dir, prompt, MAX_NEW, set(engine.eos_token_ids))
        assert_same_or_near_tie(smollm2_dir, prompt, outputs[str(i)], expected, f"prompt {i}")


def test_speculation_with_a_random_head_equals_plain_decoding(smollm2_dir, tmp_path):
    questions = (QUESTIONS + [q + " Answer briefly." for q in QUESTIONS])[:20]
    prompts = chat_prompts(smollm2_dir, questions)
    params = SamplingParams(temperature=0, max_tokens=16)
    plain = run_staggered(make_engine(smollm2_dir, max_model_len=2048, max_num_seqs=8), prompts, params, first=8)
    head = random_head_dir(smollm2_dir, tmp_path / "head")
    # A small tree keeps this fp32 test quick; tree shapes are covered on the tiny models.
    tree = SpecConfig(num_draft_tokens=8, depth=3, top_k=2)
    spec = run_staggered(make_engine(smollm2_dir, max_model_len=2048, draft=str(head), spec=tree, max_num_seqs=8), prompts, params, first=8)
    for i, prompt in enumerate(prompts):
        assert_same_or_near_tie(smollm2_dir, prompt, spec[str(i)], plain[str(i)], f"prompt {i}")
