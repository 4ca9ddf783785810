"""Attention kernels for decoding: per call, and in the engine.

    .venv/bin/python -m bench.attention [--device cpu] [--engine-concurrency 1 16 64]

Kernels: torch's sdpa (bf16, as the model runs, and on float32 copies) against the engine's
`single_query_attention` for one new token per sequence, and sdpa alone for the multi-token
groups the engine leaves to it (draft trees, prefill). Shapes follow SmolLM2-135M (9 query heads,
3 KV heads, head_dim 64); keys = keys per sequence. The median of --rounds rounds is reported:
this machine's neighbours make single rounds noisy.

Engine: plain decoding of the default model (64 tokens per request, EOS ignored) at each
--engine-concurrency, with the engine's single-query path and with sdpa put back in its place,
the two taking turns within each round so that drift in machine load hits both alike.
Writes bench/results/attention-<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bench.engine_throughput import QUESTIONS, chat_prompts, engine_config, engine_rate, first_n
from bench.environment import write_result
from eagle_core import LLM, SamplingParams
from eagle_core.config import ModelConfig
from eagle_core.worker import attn_gather as attention
from eagle_core.worker.attn_gather import single_query_attention

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
# (batch, new tokens per sequence, keys per sequence)
SHAPES = [(1, 1, 30), (1, 1, 100), (1, 1, 300), (1, 1, 2000), (4, 1, 300), (16, 1, 300), (64, 1, 300), (1, 8, 300), (1, 3, 300)]


def per_call_us(fn, repeats: int) -> float:
    for _ in range(10):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e6 * (time.perf_counter() - start) / repeats


def sdpa_single_query(q, k, v, mask, scale):
    """What the engine ran before single_query_attention: sdpa on the bf16 tensors."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def engine_rows(concurrency: list[int], rounds: int) -> list[dict]:
    model, dtype = ModelConfig.model, "bfloat16"
    llm = LLM(model=model, dtype=dtype, config=engine_config(model, dtype, max(concurrency)))
    prompts = chat_prompts(llm, QUESTIONS)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    kernels = {"single_query": single_query_attention, "sdpa_bf16": sdpa_single_query}
    rates: dict[tuple[int, str], list[float]] = {}
    for round_ in range(rounds):
        for c in concurrency:
            batch = first_n(prompts, c)
            names = list(kernels)[round_ % 2 :] + list(kernels)[: round_ % 2]
            for name in names:
                attention.single_query_attention = kernels[name]
                try:
                    rate = engine_rate(llm, batch, params)["tokens_per_s"]
                finally:
                    attention.single_query_attention = single_query_attention
                rates.setdefault((c, name), []).append(rate)
                print(f"round {round_ + 1}, {c} requests, {name}: {rate:.1f} tok/s", flush=True)
    return [
        {"concurrency": c, "kernel": name, "tokens_per_s_median": statistics.median(r), "tokens_per_s": r}
        for (c, name), r in rates.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engine-concurrency", type=int, nargs="*", default=[1, 16, 64])
    parser.add_argument("--engine-rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for batch, q_len, keys in SHAPES:
        dtype = torch.bfloat16
        q = torch.randn(batch, HEADS, q_len, HEAD_DIM, dtype=dtype, device=args.device)
        k = torch.randn(batch, KV_HEADS, keys, HEAD_DIM, dtype=dtype, device=args.device)
        v = torch.randn(batch, KV_HEADS, keys, HEAD_DIM, dtype=dtype, device=args.device)
        # A decoding batch masks each sequence's padding; a tree masks non-ancestors.
        mask = torch.rand(batch, 1, q_len, keys, device=args.device) < 0.9
        mask[..., 0] = True
        # Default arguments bind this shape's tensors (each lambda also runs within its iteration).
        kernels = {
            "sdpa_bf16": lambda q=q, k=k, v=v, mask=mask: F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=True
            ),
            "sdpa_fp32": lambda q=q, k=k, v=v, mask=mask: F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True
            ).to(q.dtype),
        }
        if q_len == 1:
            kernels["single_query"] = lambda q=q, k=k, v=v, mask=mask: single_query_attention(q, k, v, mask, None)
        row = {"batch": batch, "q_len": q_len, "keys": keys}
        for name, fn in kernels.items():
            row[f"{name}_us"] = statistics.median(per_call_us(fn, args.repeats) for _ in range(args.rounds))
        rows.append(row)
        print(", ".join(f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}" for key, value in row.items()), flush=True)
    engine = engine_rows(args.engine_concurrency, args.engine_rounds) if args.engine_concurrency else []
    for row in engine:
        print(f"engine, {row['concurrency']} requests, {row['kernel']}: median {row['tokens_per_s_median']:.1f} tok/s")
    out = write_result(args.out, "attention", {"settings": vars(args), "rows": rows, "engine": engine})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
