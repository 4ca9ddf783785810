"""Offline engine throughput: eagle-serve's engine at 1, 4 and 16 concurrent requests next to
transformers' generate() on the same prompts (batch 1).

    .venv/bin/python -m bench.engine_throughput [--dtype bfloat16] [--max-tokens 64] [--draft DIR]

Every request generates exactly --max-tokens tokens (EOS ignored) so all rows do equal work.
Results: a table on stdout and bench/results/engine-<date>-<host>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch
import transformers

from bench.environment import machine_info, write_result
from eagle_core import LLM, SamplingParams
from eagle_core.config import COMPILE_MODES, EngineConfig, ModelConfig, SchedulerConfig, SpecConfig

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain how a rainbow forms.",
    "Give me three tips for better sleep.",
    "What are the main differences between TCP and UDP?",
    "Write a short poem about the ocean.",
    "How do vaccines work?",
    "Summarise the causes of the French Revolution.",
    "What is a hash table and when would you use one?",
    "Describe the water cycle.",
    "Suggest a name for a bakery and explain it.",
    "What is the Pythagorean theorem?",
    "How can I make a good cup of coffee?",
    "Explain recursion to a beginner.",
    "What should I pack for a weekend hiking trip?",
    "Why do leaves change colour in autumn?",
]


def engine_config(model: str, dtype: str, max_num_seqs: int, compile: str = "auto") -> EngineConfig:
    """Plain decoding (draft=None, not "auto", which would load the shipped head for the default
    model) with room for max_num_seqs requests at once."""
    return EngineConfig(
        model=ModelConfig(model=model, dtype=dtype, max_model_len=2048, compile=compile),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs),
        spec=SpecConfig(draft=None),
    )


def chat_prompts(llm: LLM, questions: list[str]) -> list[list[int]]:
    """Each question as a one-turn chat, tokenized; then a short warm-up generation."""
    prompts = [llm.engine.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8))
    return prompts


def first_n(prompts: list[list[int]], n: int) -> list[list[int]]:
    """n prompts, cycling through the list when it is shorter."""
    return (prompts * (n // len(prompts) + 1))[:n]


def engine_rate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    steps = sum(o.spec.num_steps for o in outputs)
    emitted = sum(o.spec.num_emitted_tokens for o in outputs)
    return {
        "requests": len(prompts),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
        "mean_acceptance_length": round(emitted / steps, 3) if steps else None,
    }


def sequential_rate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict:
    """Batch 1: the prompts one after another, each alone in the engine (the HF row's prompts)."""
    rows = [engine_rate(llm, [prompt], params) for prompt in prompts]
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    taus = [r["mean_acceptance_length"] for r in rows if r["mean_acceptance_length"]]
    return {
        "requests": len(prompts),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2),
        "mean_acceptance_length": round(sum(taus) / len(taus), 3) if taus else None,
    }


def hf_rate(model, prompts: list[list[int]], max_tokens: int) -> dict:
    tokens, start = 0, time.perf_counter()
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                min_new_tokens=max_tokens, do_sample=False, pad_token_id=0,
            )
        tokens += out.shape[1] - len(prompt)
    seconds = time.perf_counter() - start
    return {"requests": len(prompts), "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=ModelConfig.model)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--hf-prompts", type=int, default=4, help="prompts for the generate() row")
    parser.add_argument("--draft", default=None, help="EAGLE head: adds speculative rows")
    parser.add_argument("--compile", default="auto", choices=COMPILE_MODES, help="the engines' --compile")
    parser.add_argument("--prompts", default=None, help="JSONL file with a 'prompt' per line "
                        "(e.g. the head's held-out prompts: the last lines of .cache/train/smollm2/prompts.jsonl, "
                        "made by `python -m eagle_core.train configs/train/smollm2.yaml --stages prompts`)")
    parser.add_argument("--last", type=int, default=16, help="with --prompts: use the last N prompts")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    # The plain rows decode without a draft head; the EAGLE rows speculate at every batch size.
    config = engine_config(args.model, args.dtype, max(args.concurrency), args.compile)
    llm = LLM(model=args.model, dtype=args.dtype, config=config)
    questions = QUESTIONS
    if args.prompts:
        lines = Path(args.prompts).read_text().splitlines()
        questions = [json.loads(line)["prompt"] for line in lines if line.strip()][-args.last :]
    prompts = chat_prompts(llm, questions)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)

    rows = {}
    draft_weights = None
    for c in args.concurrency:
        batch = first_n(prompts, c)
        rows[f"engine c={c}"] = (
            sequential_rate(llm, prompts[: args.hf_prompts], params) if c == 1 else engine_rate(llm, batch, params)
        )
        print(f"engine     c={c:<3} {rows[f'engine c={c}']['tokens_per_s']:8.1f} tok/s", flush=True)
    if args.draft:
        spec_llm = LLM(model=args.model, dtype=args.dtype, config=EngineConfig(
            model=config.model, scheduler=config.scheduler, spec=SpecConfig(draft=args.draft, max_batch=0)))
        spec_llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8))
        draft_weights = spec_llm.engine.worker.draft_weights
        for c in args.concurrency:
            batch = first_n(prompts, c)
            rows[f"eagle c={c}"] = (
                sequential_rate(spec_llm, prompts[: args.hf_prompts], params)
                if c == 1
                else engine_rate(spec_llm, batch, params)
            )
            print(f"eagle      c={c:<3} {rows[f'eagle c={c}']['tokens_per_s']:8.1f} tok/s "
                  f"(tau {rows[f'eagle c={c}']['mean_acceptance_length']})", flush=True)

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        llm.engine.worker.target.model.name_or_path, dtype=llm.engine.worker.dtype
    ).to(llm.engine.worker.device).eval()  # the engine's device, so a GPU run compares like with like
    rows["hf generate c=1"] = hf_rate(hf_model, prompts[: args.hf_prompts], args.max_tokens)
    print(f"hf generate c=1   {rows['hf generate c=1']['tokens_per_s']:8.1f} tok/s", flush=True)

    def rate(name: str) -> float:
        return rows[name]["tokens_per_s"]

    summary = {}
    if 1 in args.concurrency:  # batch-1 comparisons need the batch-1 row
        summary["engine_c1_vs_hf"] = round(rate("engine c=1") / rate("hf generate c=1"), 2)
        summary.update({f"engine_c{c}_vs_c1": round(rate(f"engine c={c}") / rate("engine c=1"), 2)
                        for c in args.concurrency})
    if args.draft:  # what speculating at every batch size gains or costs (--spec-max-batch)
        summary.update({f"eagle_c{c}_vs_engine": round(rate(f"eagle c={c}") / rate(f"engine c={c}"), 2)
                        for c in args.concurrency})
    payload = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(None),
        "threads": torch.get_num_threads(),
        "settings": vars(args),
        "draft_weights": draft_weights,
        "rows": rows,
        "summary": summary,
    }
    suffix = (f"-{Path(args.prompts).stem}" if args.prompts else "") + (f"-compile-{args.compile}" if args.compile != "auto" else "")
    path = write_result(args.out, "engine", payload, suffix)
    print(json.dumps(summary), f"\nwritten to {path}")


if __name__ == "__main__":
    main()
