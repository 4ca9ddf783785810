"""The CPU paged-attention kernel per call: this tree's against another revision's, in one process.

    .venv/bin/python -m bench.attention_kernel --against REV [--rounds 5] [--machine NAME]

Both sources of `eagle_core/worker/csrc/paged_attention.cpp` (this tree's and `git show
REV:...`) are built as two operators under distinct names with the flags the engine uses, then
called on the same inputs, taking turns within each round; the outputs must agree (the kernel's
arithmetic is meant to be the same across such changes; the largest difference is reported).
Shapes follow SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64): decode tiles (one token,
padded to two query slots as the engine pads them, the padding slot seeing no key), trees of 8
and 16 nodes, over contiguous 16-token cache blocks as the engine allocates them, with each
tile's causal/tree visibility approximated by every key of its context visible. Contexts are
the bucket's key length, or ("ragged") spread evenly up to it, as a batch of requests of
different lengths shares one bucket. The minimum over rounds of the mean of --calls calls is
reported, for the torch thread count of the process.
Writes bench/results/attention-kernel-<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.environment import write_result
from eagle_core.worker import cpu_kernels
from eagle_core.worker.cpu_kernels import _SOURCE

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
# (tiles, real query slots per tile, query slots per tile, keys per tile, ragged contexts)
SHAPES = [
    (1, 1, 2, 200, False), (4, 1, 2, 300, False), (16, 1, 2, 300, False), (8, 1, 2, 800, True),
    (8, 2, 2, 800, True), (1, 8, 8, 200, False), (1, 16, 16, 200, False), (1, 16, 16, 600, False),
    (4, 8, 8, 300, False), (4, 16, 16, 300, False), (16, 8, 8, 300, False), (8, 8, 8, 800, True),
]


def build(name: str, source: str, build_dir: Path):
    """The kernel in `source`, registered as torch.ops.<name>.paged_attention."""
    build_dir.mkdir(parents=True, exist_ok=True)
    path = build_dir / f"{name}.cpp"
    path.write_text(source.replace("TORCH_LIBRARY(eagle_serve", f"TORCH_LIBRARY({name}").replace(
        "TORCH_LIBRARY_IMPL(eagle_serve", f"TORCH_LIBRARY_IMPL({name}"))
    cpu_kernels.build(name, path, build_dir)
    return getattr(torch.ops, name).paged_attention


def inputs(tiles: int, real: int, width: int, keys: int, ragged: bool, dtype: torch.dtype, generator: torch.Generator):
    blocks_per_tile = -(-keys // BLOCK)
    num_blocks = tiles * blocks_per_tile + 1
    cache = [torch.randn(num_blocks * BLOCK, KV_HEADS, HEAD_DIM, generator=generator).to(dtype) for _ in range(2)]
    order = torch.randperm(num_blocks, generator=generator)[: tiles * blocks_per_tile].view(tiles, blocks_per_tile)
    slots = (order[:, :, None] * BLOCK + torch.arange(BLOCK)).reshape(tiles, -1)[:, :keys].contiguous()  # [N, L]
    query = torch.randn(tiles, width, HEADS, HEAD_DIM, generator=generator)
    visible = torch.zeros(tiles, width, keys, dtype=torch.bool)  # [N, Q, L]
    for n in range(tiles):
        visible[n, :real, : keys * (n + 1) // tiles if ragged else keys] = True
    return query, cache[0], cache[1], slots, visible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="git revision whose kernel source is the baseline")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    relative = _SOURCE.relative_to(Path.cwd()) if _SOURCE.is_relative_to(Path.cwd()) else _SOURCE
    against_commit = subprocess.run(["git", "rev-parse", args.against], capture_output=True, text=True,
                                    check=True).stdout.strip()
    baseline = subprocess.run(["git", "show", f"{args.against}:{relative}"], capture_output=True, text=True, check=True).stdout
    work = Path(tempfile.mkdtemp(prefix="attention-kernel-"))
    ops = {"this tree": build("pa_this", _SOURCE.read_text(), work / "this"),
           args.against: build("pa_base", baseline, work / "base")}
    generator = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for tiles, real, width, keys, ragged in SHAPES:
            operands = inputs(tiles, real, width, keys, ragged, dtype, generator)
            call = {name: functools.partial(op, *operands, HEAD_DIM**-0.5, 2**62) for name, op in ops.items()}
            outputs = [fn() for fn in call.values()]
            best = dict.fromkeys(call, float("inf"))
            for _ in range(args.rounds):
                for name, fn in call.items():
                    start = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    best[name] = min(best[name], (time.perf_counter() - start) / args.calls * 1e6)
            row = {"dtype": str(dtype).removeprefix("torch."), "tiles": tiles, "real_query_slots": real,
                   "query_slots": width, "keys": keys, "ragged": ragged,
                   "us_per_call": best, "max_abs_difference": (outputs[0] - outputs[1]).abs().max().item()}
            rows.append(row)
            print(f"{row['dtype']:8} tiles {tiles:2} slots {real:2}/{width:2} keys {keys:3}{' ragged' if ragged else ''}: "
                  + ", ".join(f"{name} {us:.0f} us" for name, us in best.items())
                  + f"; ratio {best['this tree'] / best[args.against]:.2f}; max diff {row['max_abs_difference']:.2g}")
    path = write_result(args.out, "attention-kernel", {"against": args.against, "against_commit": against_commit,
                                                         "threads": torch.get_num_threads(),
                                                         "rounds": args.rounds, "calls": args.calls, "rows": rows},
                        suffix=f"-{args.machine}" if args.machine else "")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
