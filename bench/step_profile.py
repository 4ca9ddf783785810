"""Where one engine step's time goes: torch.profiler over a few decode steps, plain or EAGLE.

    python -m bench.step_profile [--model smollm2] [--draft HEAD] [--batch 1] [--steps 20]
        [--compile auto] [--out bench/results]

`--batch` requests (chat prompts, T=0, EOS ignored) are brought into the decode phase, then
`--steps` calls of `Engine.step()` run under torch.profiler (CPU activity, and CUDA's where a
GPU runs the engine). Written: the operator table sorted by self host time (what each op costs
the host, with its call count: on a GPU each eager op is at least one kernel launch), the
same sorted by device time on a GPU, and the host time spent waiting in synchronising calls
(`cudaStreamSynchronize`, `cudaMemcpyAsync` to the host, `aten::item`, `aten::_local_scalar_dense`).
Results: bench/results/step-profile-<date>-<machine>-<plain|eagle>-b<batch>.txt
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

import torch

from bench.engine_throughput import QUESTIONS
from bench.environment import machine_info, machine_name
from eagle_core import Engine, EngineConfig, SamplingParams
from eagle_core.config import COMPILE_MODES, ModelConfig, SchedulerConfig, SpecConfig

SYNCING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "aten::item", "aten::_local_scalar_dense")
"""Calls in which the host waits for the device (a copy to the host included)."""


def decoding_engine(args: argparse.Namespace) -> Engine:
    """An engine with `args.batch` requests past their prefill."""
    engine = Engine(
        EngineConfig(
            model=ModelConfig(model=args.model, compile=args.compile, max_model_len=2048),
            scheduler=SchedulerConfig(max_num_seqs=max(args.batch, 1)),
            spec=SpecConfig(draft=args.draft, max_batch=0),
        )
    )
    params = SamplingParams(temperature=0, max_tokens=args.steps * 16 + 64, ignore_eos=True)
    for i in range(args.batch):
        prompt = engine.apply_chat_template([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}])
        engine.add_request(str(i), prompt, params)
    for _ in range(8):  # prefill, then a few decode steps (graphs recorded, caches warm)
        engine.step()
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=ModelConfig.model)
    parser.add_argument("--draft", default=None, help="EAGLE head (default: plain decoding)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--compile", default="auto", choices=COMPILE_MODES)
    parser.add_argument("--rows", type=int, default=40, help="operators listed per table")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    engine = decoding_engine(args)
    cuda = engine.worker.device.type == "cuda"
    times = []
    for _ in range(args.steps):  # unprofiled, for the step time the profile is read against
        start = time.perf_counter()
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(args.steps):
            engine.step()
        if cuda:
            torch.cuda.synchronize()
    events = profile.key_averages()
    waits = {e.key: (e.count, e.self_cpu_time_total) for e in events if e.key in SYNCING}

    mode = "eagle" if args.draft else "plain"
    lines = [
        f"# step profile: {mode}, batch {args.batch}, {args.steps} steps, compile {args.compile}, "
        f"{datetime.date.today()}",
        f"machine: {machine_info(None)}",
        f"unprofiled: median {statistics.median(times) * 1e3:.2f} ms per step",
        "host waits (calls per step, ms per step): "
        + ", ".join(f"{k} {n / args.steps:.1f} / {t / args.steps / 1e3:.2f}" for k, (n, t) in sorted(waits.items())),
        "",
        events.table(sort_by="self_cpu_time_total", row_limit=args.rows),
    ]
    if cuda:
        lines += ["", events.table(sort_by="self_cuda_time_total", row_limit=args.rows)]
    path = Path(args.out) / f"step-profile-{datetime.date.today()}-{machine_name(None)}-{mode}-b{args.batch}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:4]), f"\nwritten to {path}")


if __name__ == "__main__":
    main()
