"""Draft heads with more than one decoder layer in the engine: each layer keeps its own paged
draft KV, and speculation stays exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from eagle_core import SamplingParams, SpecConfig
from eagle_core.batch import SeqWork
from eagle_core.spec.draft_head import (
    Eagle3Head,
    draft_config_from_target,
    eagle3_layer_ids,
    load_draft_head,
    save_draft_head,
)
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE, make_tiny_tokenizer, tiny_config


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    """A tiny Llama with 4 layers (EAGLE-3 needs at least 3 to fuse)."""
    path = tmp_path_factory.mktemp("tiny4")
    tokenizer = make_tiny_tokenizer()
    config = tiny_config("llama", tokenizer)
    config.num_hidden_layers = 4
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def head_dir(target_dir, tmp_path_factory) -> Path:
    """A random two-layer EAGLE-3 head over the full vocabulary."""
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    torch.manual_seed(1)
    head = Eagle3Head(
        draft_config_from_target(target.config, num_layers=2),
        target.get_input_embeddings(),
        eagle3_layer_ids(target.config.num_hidden_layers),
    )
    out = tmp_path_factory.mktemp("head2") / "head"
    save_draft_head(head, str(out))
    return out


def _decode_work(tokens: list[int], t: int, blocks: list[int]) -> SeqWork:
    """A drafting decode step at position t (tokens[t] is the root)."""
    return SeqWork(
        request_id="r",
        token_ids=[tokens[t]],
        start_pos=t,
        block_table=blocks,
        sample=True,
        num_draft_slots=2,
        num_tree_slots=2,
        params=SamplingParams(),
        prompt_token_ids=tokens,
        output_token_ids=[],
        max_new_tokens=1,
    )


def test_paged_drafting_matches_the_heads_own_forward(target_dir, head_dir):
    """Fed one entry per step through the paged KV, both layers give what the head computes over
    the whole sequence at once with plain causal attention."""
    engine = make_engine(target_dir, draft=str(head_dir), max_num_seqs=2)
    drafter = engine.worker.runner.drafter
    assert drafter.kv.kv.shape[0] == 2  # a KV layer per head layer
    target = AutoModelForCausalLM.from_pretrained(target_dir)
    reference = load_draft_head(
        str(head_dir), target.config, target.get_input_embeddings(), target.get_output_embeddings(),
        torch.float32, "cpu",
    )
    g = torch.Generator().manual_seed(0)
    n = 37
    tokens = torch.randint(0, TINY_VOCAB_SIZE, (n,), generator=g).tolist()
    features = torch.randn(n, reference.feature_size, generator=g)
    blocks = list(range(-(-n // drafter.block_size)))
    fed = {}
    for t in range(n):
        out = drafter.catch_up([_decode_work(tokens, t, blocks)])
        if t > 0:
            fed[t] = out["r"].hidden  # the entry at t - 1: reads token t and feature t - 1
        drafter.record("r", features[t : t + 1])
    with torch.no_grad():
        expected = reference(
            torch.tensor(tokens[1:])[None], features[None, :-1], torch.arange(n - 1)[None]
        )[0]  # [n - 1, h]
    for t, got in fed.items():
        assert torch.allclose(got, expected[t - 1], atol=1e-4), t


def test_greedy_with_a_two_layer_head_equals_plain_decoding(target_dir, head_dir):
    prompts = random_prompts(5, [3, 9, 21], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    plain = run_staggered(make_engine(target_dir), prompts, params, first=2)
    spec_engine = make_engine(
        target_dir, draft=str(head_dir), spec=SpecConfig(num_draft_tokens=8, depth=3, top_k=3)
    )
    assert spec_engine.worker.draft_head.num_layers == 2
    assert run_staggered(spec_engine, prompts, params, first=2) == plain
    assert spec_engine.spec_counters.num_drafts > 0
