"""The int4 linears' kernels against the dense bf16 weights, on SmolLM2's decoder shapes.

    python -m bench.int4_linear [--rows 1 2 4 8 16 32] [--rounds 7] [--machine NAME] [--out bench/results]

Builds 30 layers of random bf16 linears of SmolLM2-135M's shapes (q, k, v, o, gate, up, down),
each as an Int4Linear in both layouts (worker/int4_linear.py), and times one pass over all of
them (so their weights come from memory, as in a step) per path: aten's int4 kernel, the AMX
tile kernel (where the CPU has AMX), and the dense bf16 weights through oneDNN. The paths take
turns; each figure is the fastest of `--rounds` passes. Also records whether the tile kernel's
outputs equal the dense path's bit for bit.
Results: bench/results/int4-linear-<date>-<machine>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
from torch import nn

from bench.environment import machine_info, machine_name
from eagle_core.worker.int4_linear import Int4Linear, time_pass
from eagle_core.worker.loader import cpu_has_amx_bf16

SHAPES = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
"""(in, out) of one SmolLM2-135M decoder layer's linears."""
LAYERS = 30


def build(tiles: bool) -> list[Int4Linear]:
    torch.manual_seed(0)
    return [
        Int4Linear(nn.Linear(i, o, bias=False).to(torch.bfloat16), tiles=tiles)
        for _ in range(LAYERS)
        for i, o in SHAPES
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    paths = {"aten": (build(False), True)}
    if cpu_has_amx_bf16():
        paths["tiles"] = (build(True), True)
    paths["dense"] = (paths["aten"][0], False)
    rows_out = []
    with torch.inference_mode():
        for rows in args.rows:
            inputs = {n: torch.randn(rows, n, dtype=torch.bfloat16) for n in (576, 1536)}
            for linears, int4 in paths.values():  # first touches
                time_pass(linears, inputs, rows if int4 else 0)
            best = {name: float("inf") for name in paths}
            for _ in range(args.rounds):
                for name, (linears, int4) in paths.items():
                    best[name] = min(best[name], time_pass(linears, inputs, rows if int4 else 0))
            row = {"rows": rows, **{f"{name}_ms": round(best[name] * 1e3, 3) for name in paths}}
            if "tiles" in paths:
                m = paths["tiles"][0][0]
                x = inputs[m.in_features]
                row["tiles_equal_dense"] = bool(torch.equal(m.run(x, rows), m.run(x, 0)))
            rows_out.append(row)
            print(row, flush=True)
    result = {"date": str(datetime.date.today()), "machine": machine_info(args.machine),
              "threads": torch.get_num_threads(), "rounds": args.rounds, "results": rows_out}
    path = Path(args.out) / f"int4-linear-{datetime.date.today()}-{machine_name(args.machine)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
