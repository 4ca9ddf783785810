"""The engine step's host cost: a model of SmolLM2's depth but tiny width, so a step's time is
what Python, the framework and the kernels' launches cost, not arithmetic.

    .venv/bin/python -m bench.step_cost [--against REV] [--compile MODE ...] [--rounds 3] [--steps 40]

The model: a random-weight Llama with SmolLM2-135M's 30 layers and 49,152-token vocabulary
(its tokenizer), hidden size 64, 4 query and 2 KV heads, plus a random EAGLE-1 head of the same
width. For plain decoding and for EAGLE (the engine's default tree and context lookup,
speculating at every batch size), with 1, 4 and 16 sequences decoding greedily (EOS ignored,
64-token prompts, all in the decode phase before timing starts), it times `--steps` calls of
`Engine.step()` and reports the median milliseconds per step and tokens per step.

`--against REV` measures a second checkout of this repository (git worktree of REV) in the
same run: each round runs every configuration once in each checkout, alternating which goes
first, in fresh processes that import eagle_core from their own tree, so both see the same
machine. `--compile` measures this tree once per mode given (REV runs its default). Results: a
table on stdout and bench/results/step-cost-<date>-<host>[-<machine>].json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZES = (1, 4, 16)
MODES = ("plain", "eagle")
PROMPT_LEN = 64
WARMUP_STEPS = 8


# ----------------------------------------------------------------------------- the model


def make_models(out_dir: Path) -> tuple[Path, Path]:
    """Write the narrow target (with SmolLM2's tokenizer) and a random EAGLE head into out_dir."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from eagle_core.config import ModelConfig
    from eagle_core.spec.draft_head import EagleHead, draft_config_from_target, save_draft_head
    from eagle_core.worker.loader import _resolve_model

    target_dir, head_dir = out_dir / "target", out_dir / "head"
    if (target_dir / "config.json").exists() and (head_dir / "config.json").exists():
        return target_dir, head_dir
    smollm2_dir, _, _ = _resolve_model(ModelConfig().model)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=30,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    head = EagleHead(draft_config_from_target(config), model.get_input_embeddings(), model.get_output_embeddings())
    save_draft_head(head, str(head_dir))
    return target_dir, head_dir


# ----------------------------------------------------------------------------- one measurement


def measure(target_dir: str, head_dir: str, mode: str, batch: int, steps: int, compile_mode: str | None) -> dict:
    """Median ms per Engine.step() with `batch` sequences decoding (runs in a child process)."""
    import random

    from eagle_core import Engine, EngineConfig, SamplingParams
    from eagle_core.config import CacheConfig, ModelConfig, SchedulerConfig, SpecConfig

    spec = SpecConfig(draft=head_dir if mode == "eagle" else None, max_batch=0, lookup_max_batch=0)
    # the revision measured against may predate ModelConfig.compile: pass it only when asked
    compile_arg = {} if compile_mode is None else {"compile": compile_mode}
    engine = Engine(
        EngineConfig(
            model=ModelConfig(model=target_dir, max_model_len=2048, **compile_arg),
            cache=CacheConfig(kv_cache_tokens=16 * 2048 + 4096),
            scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048),
            spec=spec,
        )
    )
    rng = random.Random(batch)
    params = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)
    for i in range(batch):
        engine.add_request(str(i), [rng.randrange(100, 49000) for _ in range(PROMPT_LEN)], params)
    for _ in range(WARMUP_STEPS):
        engine.step()
    times, tokens = [], 0
    for _ in range(steps):
        start = time.perf_counter()
        outputs = engine.step()
        times.append(time.perf_counter() - start)
        tokens += sum(len(o.new_token_ids) for o in outputs)
    return {
        "mode": mode,
        "batch": batch,
        "ms_per_step": round(statistics.median(times) * 1000, 3),
        "tokens_per_step": round(tokens / steps, 2),
    }


def child_main(args: argparse.Namespace) -> None:
    rows = [measure(args.target, args.head, mode, batch, args.steps, args.compile_mode)
            for mode in MODES for batch in BATCH_SIZES]
    print("RESULT " + json.dumps(rows), flush=True)


def run_child(code_dir: Path, target: Path, head: Path, steps: int, compile_mode: str | None) -> list[dict]:
    """One pass over every configuration in a fresh process importing eagle_core from code_dir
    (`compile_mode`: ModelConfig.compile, None for the tree's default)."""
    env = dict(os.environ, PYTHONPATH=str(code_dir))
    # This file, not code_dir's copy: the older tree need not have it.
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--target", str(target),
           "--head", str(head), "--steps", str(steps)]
    if compile_mode is not None:
        cmd += ["--compile-mode", compile_mode]
    out = subprocess.run(cmd, env=env, cwd=code_dir, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"step_cost child in {code_dir} failed:\n{out.stderr[-4000:]}")


def worktree(rev: str) -> Path:
    """A detached checkout of `rev` in a temporary directory."""
    path = Path(tempfile.mkdtemp(prefix="step-cost-")) / "tree"
    subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", "-q", str(path), rev], check=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="git revision to measure in the same run (e.g. the commit before a change)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per configuration")
    parser.add_argument("--compile", nargs="+", default=[None], metavar="MODE",
                        help="measure this tree with each of these --compile modes (default: its default)")
    parser.add_argument("--machine", help="name for the result file (default: the host name)")
    parser.add_argument("--out", default=str(REPO_ROOT / "bench" / "results"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--head", help=argparse.SUPPRESS)
    parser.add_argument("--compile-mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return

    from bench.environment import machine_info, machine_name, write_result
    from eagle_core.worker.loader import cache_root

    target, head = make_models(cache_root() / "bench" / "step-cost-model")
    # name -> (checkout, --compile mode or None for its default)
    trees = {_tree_name(mode): (REPO_ROOT, mode) for mode in args.compile}
    other = worktree(args.against) if args.against else None
    if other is not None:
        trees[args.against] = (other, None)
    samples: dict[str, dict[tuple[str, int], list[dict]]] = {name: {} for name in trees}
    try:
        for round_index in range(args.rounds):
            order = list(trees) if round_index % 2 == 0 else list(trees)[::-1]
            for name in order:
                code_dir, compile_mode = trees[name]
                for row in run_child(code_dir, target, head, args.steps, compile_mode):
                    samples[name].setdefault((row["mode"], row["batch"]), []).append(row)
                print(f"round {round_index + 1}/{args.rounds}: {name} done", flush=True)
    finally:
        if other is not None:
            subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(other)], check=False)
            shutil.rmtree(other.parent, ignore_errors=True)

    table = []
    for name, by_config in samples.items():
        for (mode, batch), rows in by_config.items():
            table.append({
                "code": name,
                "mode": mode,
                "batch": batch,
                "ms_per_step": round(statistics.median(r["ms_per_step"] for r in rows), 3),
                "ms_per_step_runs": [r["ms_per_step"] for r in rows],
                "tokens_per_step": round(statistics.median(r["tokens_per_step"] for r in rows), 2),
            })
    print(f"{'code':<32} {'mode':<6} {'batch':>5} {'ms/step':>9} {'tokens/step':>12}")
    for row in table:
        print(f"{row['code'][:32]:<32} {row['mode']:<6} {row['batch']:>5} {row['ms_per_step']:>9.2f} {row['tokens_per_step']:>12.2f}")
    payload = {
        "benchmark": "step_cost",
        "date": datetime.date.today().isoformat(),
        "machine": machine_info(args.machine),
        "settings": {"rounds": args.rounds, "steps": args.steps, "prompt_len": PROMPT_LEN,
                     "against": args.against, "compile": args.compile, "head_rev": _head_rev()},
        "rows": table,
    }
    path = write_result(args.out, "step-cost", payload, f"-{machine_name(args.machine)}" if args.machine else "")
    print(f"wrote {path}")


def _tree_name(compile_mode: str | None) -> str:
    return "this tree" if compile_mode is None else f"this tree, --compile {compile_mode}"


def _head_rev() -> str:
    out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


if __name__ == "__main__":
    main()
