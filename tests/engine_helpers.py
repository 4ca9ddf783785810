"""Helpers for tests that drive the real engine on small models."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from eagle_core import Engine, EngineConfig, SamplingParams
from eagle_core.config import SPEC_DEFAULTS, CacheConfig, ModelConfig, SchedulerConfig, SpecConfig


def make_engine(
    model_dir: Path | str,
    *,
    draft: str | None = None,
    kv_tokens: int = 8192,
    max_model_len: int | None = None,
    spec: SpecConfig | None = None,
    dtype: str = "float32",
    spec_max_batch: int = 0,
    weight_packing: str = "auto",
    weight_quantization: str = "none",
    compile: str = "off",
    attention_backend: str = "auto",
    deterministic: bool = False,
    prefix_caching: bool = True,
    **sched,
) -> Engine:
    config = EngineConfig(
        model=ModelConfig(
            model=str(model_dir), dtype=dtype, device="cpu", max_model_len=max_model_len, weight_packing=weight_packing,
            compile=compile, attention_backend=attention_backend, deterministic=deterministic,
            weight_quantization=weight_quantization,
        ),
        cache=CacheConfig(kv_cache_tokens=kv_tokens, prefix_caching=prefix_caching),
        scheduler=dataclasses.replace(SchedulerConfig(), **sched),
        # Tests of speculation want trees whatever the batch size (no load-based fallback) unless
        # they pass spec_max_batch, and the wide tree unless they pass one: the fp32 CPU default
        # is a small one.
        spec=dataclasses.replace(
            (spec or SpecConfig()).with_defaults(SPEC_DEFAULTS), draft=draft, max_batch=spec_max_batch
        ),
    )
    return Engine(config)


def run_staggered(
    engine: Engine,
    prompts: list[list[int]],
    params: SamplingParams,
    first: int | None = None,
    join_after_steps: int = 3,
) -> dict[str, list[int]]:
    """Submit `first` prompts, step a few times (so they are decoding), then submit the rest
    while those run. Returns request id -> output token ids."""
    first = len(prompts) if first is None else first
    outputs: dict[str, list[int]] = {}
    for i in range(first):
        engine.add_request(str(i), prompts[i], params)
    steps = 0
    while engine.has_unfinished() or steps <= join_after_steps:
        if steps == join_after_steps:
            for i in range(first, len(prompts)):
                engine.add_request(str(i), prompts[i], params)
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
        steps += 1
    return outputs


def hf_greedy(model_dir: Path | str, prompt: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """transformers generate() greedy continuation in fp32, cut before the first EOS."""
    model = _hf_model(str(model_dir))
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        pad_token_id=0,
    )[0, len(prompt):].tolist()
    for i, token in enumerate(out):
        if token in eos_ids:
            return out[:i]
    return out


_MODELS: dict[str, torch.nn.Module] = {}


def _hf_model(model_dir: str):
    if model_dir not in _MODELS:
        _MODELS[model_dir] = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
    return _MODELS[model_dir]


def top2_gap(model_dir: Path | str, prefix: list[int]) -> float:
    """Difference between the target's two largest next-token logits after `prefix` (fp32)."""
    with torch.inference_mode():
        logits = _hf_model(str(model_dir))(torch.tensor([prefix])).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def random_prompts(seed: int, lengths: list[int], vocab: int, low: int = 4) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(low, vocab, (n,), generator=gen).tolist() for n in lengths]
