"""The same engine on CUDA (skipped without a GPU): greedy parity and lossless speculation, eager
and as compiled CUDA graphs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagle_core import Engine, EngineConfig, SamplingParams, SpecConfig
from eagle_core.config import SPEC_DEFAULTS, CacheConfig, ModelConfig
from tests.engine_helpers import hf_greedy, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import random_head_dir

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def cuda_engine(model_dir, draft=None, dtype="float32", compile="off") -> Engine:
    """Speculating at every batch size with the wide tree, so that batches mix trees."""
    return Engine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype=dtype, device="cuda", compile=compile),
            cache=CacheConfig(kv_cache_tokens=8192),
            spec=dataclasses.replace(SpecConfig().with_defaults(SPEC_DEFAULTS), draft=draft, max_batch=0),
        )
    )


def test_greedy_on_cuda_matches_transformers_on_cpu(tiny_llama_dir):
    engine = cuda_engine(tiny_llama_dir)
    assert engine.worker.device.type == "cuda"
    assert not torch.backends.cuda.cudnn_sdp_enabled()  # see loader.load_model
    prompts = random_prompts(21, [3, 17, 40, 100, 9, 64], TINY_VOCAB_SIZE)
    outputs = run_staggered(engine, prompts, SamplingParams(temperature=0, max_tokens=16), first=3)
    for i, prompt in enumerate(prompts):
        assert outputs[str(i)] == hf_greedy(tiny_llama_dir, prompt, 16, set(engine.eos_token_ids))


def test_speculation_on_cuda_equals_plain_decoding(tiny_llama_dir, tmp_path):
    head = random_head_dir(tiny_llama_dir, tmp_path / "head")
    prompts = random_prompts(22, [5 + 9 * i for i in range(12)], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=20)
    plain = run_staggered(cuda_engine(tiny_llama_dir), prompts, params)
    spec = run_staggered(cuda_engine(tiny_llama_dir, draft=str(head)), prompts, params)
    assert spec == plain


def test_bf16_on_cuda_runs(tiny_llama_dir):
    engine = cuda_engine(tiny_llama_dir, dtype="bfloat16")
    outputs = run_staggered(engine, random_prompts(23, [8, 30], TINY_VOCAB_SIZE), SamplingParams(temperature=0.7, seed=1, max_tokens=12, ignore_eos=True))
    assert all(len(tokens) == 12 for tokens in outputs.values())


def test_cuda_graphs_give_the_eager_greedy_text(tiny_llama_dir, tmp_path):
    """Compiled forwards replayed as CUDA graphs (worker/compiled.py), plain and speculative,
    prompts arriving while others decode (chunked prefill beside decode steps and trees): the
    same tokens as eager plain decoding, and no graph skipped."""
    from torch._dynamo.utils import counters

    head = random_head_dir(tiny_llama_dir, tmp_path / "head")
    prompts = random_prompts(24, [3, 9, 40, 75, 17, 130], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = run_staggered(cuda_engine(tiny_llama_dir), prompts, params, first=2)
    counters.clear()
    for draft in (None, str(head)):
        engine = cuda_engine(tiny_llama_dir, draft=draft, compile="on")
        assert engine.worker.target._run.graphs
        assert run_staggered(engine, prompts, params, first=2) == reference, draft
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] > 0


def test_seeded_sampling_under_cuda_graphs_matches_eager(tiny_llama_dir, tmp_path):
    head = random_head_dir(tiny_llama_dir, tmp_path / "head")
    prompts = random_prompts(25, [4, 12, 30], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=20, ignore_eos=True)
    eager = run_staggered(cuda_engine(tiny_llama_dir), prompts, params)
    graphs = run_staggered(cuda_engine(tiny_llama_dir, draft=str(head), compile="on"), prompts, params)
    assert graphs == eager
