"""What `--deterministic` costs: SmolLM2 plain decoding with and without it, in one process.

    .venv/bin/python -m bench.deterministic [--dtype bfloat16] [--rounds 3] [--steps 16] [--compiled]

Engines are built side by side, `--compile off` (the eager path deterministic mode runs on),
`--deterministic`, and with `--compiled` also the default compiled step, and driven in turn each
round (the order rotating), so drift in machine load spreads over all of them. Per engine and
round: batch 1 and batch 8 (chat prompts of different lengths, seeded T=0.8, EOS ignored, every
sequence decoding before timing starts), the median milliseconds of `--steps` steps; and the
step that prefills one 256-token prompt alone. Prints a table of medians over rounds, with the
spread (min-max of the rounds).
"""

from __future__ import annotations

import argparse
import statistics
import time

from eagle_core import Engine, EngineConfig, SamplingParams
from eagle_core.config import CacheConfig, ModelConfig, SpecConfig

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain photosynthesis in two sentences.",
    "List three primary colors.",
    "Translate 'good morning' into Spanish and German, then explain the difference in formality.",
    "What is 17 times 23?",
    "Give me a haiku about autumn leaves falling on a quiet river at dusk.",
    "Summarise the plot of Romeo and Juliet.",
]
BATCHES = (1, 8)
PREFILL_TOKENS = 256


def engine(dtype: str, compile: str, deterministic: bool) -> Engine:
    return Engine(EngineConfig(
        model=ModelConfig(dtype=dtype, device="cpu", compile=compile, deterministic=deterministic, max_model_len=2048),
        cache=CacheConfig(kv_cache_tokens=16384),
        spec=SpecConfig(draft=None),
    ))


def decode_ms(eng: Engine, prompts: list[list[int]], steps: int) -> float:
    """Median ms of `steps` decode steps with every prompt running."""
    for i, prompt in enumerate(prompts):
        eng.add_request(f"d{i}", prompt, SamplingParams(temperature=0.8, seed=i, max_tokens=steps + 64, ignore_eos=True))
    started: set[str] = set()
    while len(started) < len(prompts):
        started |= {out.request_id for out in eng.step() if out.new_token_ids}
    eng.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        eng.step()
        times.append((time.perf_counter() - start) * 1e3)
    for i in range(len(prompts)):
        eng.abort(f"d{i}")
    while eng.has_unfinished():
        eng.step()
    return statistics.median(times)


def prefill_ms(eng: Engine, prompt: list[int]) -> float:
    eng.add_request("p", prompt, SamplingParams(temperature=0, max_tokens=1))
    start = time.perf_counter()
    eng.step()
    elapsed = (time.perf_counter() - start) * 1e3
    while eng.has_unfinished():
        eng.step()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--compiled", action="store_true", help="also the default compiled step")
    args = parser.parse_args()
    variants = {"eager": engine(args.dtype, "off", False), "deterministic": engine(args.dtype, "off", True)}
    if args.compiled:
        variants["compiled"] = engine(args.dtype, "on", False)
    tokenizer = variants["eager"].tokenizer
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)["input_ids"]
        for q in QUESTIONS
    ]
    long_prompt = (sum(prompts, []) * 4)[:PREFILL_TOKENS]
    results: dict[tuple[str, str], list[float]] = {}
    names = list(variants)
    for round_index in range(args.rounds):
        order = names[round_index % len(names):] + names[: round_index % len(names)]
        for name in order:
            eng = variants[name]
            for batch in BATCHES:
                results.setdefault((name, f"decode batch {batch}"), []).append(decode_ms(eng, prompts[:batch], args.steps))
            results.setdefault((name, f"prefill {PREFILL_TOKENS} tokens"), []).append(prefill_ms(eng, long_prompt))
        print(f"round {round_index + 1} done", flush=True)
    print(f"\nSmolLM2, {args.dtype}, ms per step: median of {args.rounds} rounds (min-max of the rounds)")
    columns = [f"decode batch {b}" for b in BATCHES] + [f"prefill {PREFILL_TOKENS} tokens"]
    print("| engine | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name in names:
        cells = []
        for column in columns:
            values = results[(name, column)]
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
