"""Per-call time of the attention kernels for the shapes one decoding step produces.

    .venv/bin/python -m bench.attention [--device cpu] [--repeats 300]

Compares torch's sdpa (bf16, as the model runs, and on float32 copies) with the engine's
`single_query_attention` for one new token per sequence, and sdpa alone for the multi-token
groups the engine leaves to it (draft trees, prefill). Shapes follow SmolLM2-135M (9 query heads,
3 KV heads, head_dim 64); L = keys per sequence. The median of --rounds rounds is reported: this
machine's neighbours make single rounds noisy.
Writes bench/results/attention-<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bench.environment import write_result
from eagle_core.worker.attention import single_query_attention

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
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
        kernels = {
            "sdpa_bf16": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
            "sdpa_fp32": lambda: F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True
            ).to(dtype),
        }
        if q_len == 1:
            kernels["single_query"] = lambda: single_query_attention(q, k, v, mask, None)
        row = {"batch": batch, "q_len": q_len, "keys": keys}
        for name, fn in kernels.items():
            row[f"{name}_us"] = statistics.median(per_call_us(fn, args.repeats) for _ in range(args.rounds))
        rows.append(row)
        print(", ".join(f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}" for key, value in row.items()), flush=True)
    out = write_result(args.out, "attention", {"settings": vars(args), "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
