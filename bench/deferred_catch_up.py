"""What deferred draft catch-up saves above --spec-max-batch, in one process, interleaved.

    .venv/bin/python -m bench.deferred_catch_up [--concurrency 8 16] [--rounds 3] [--max-tokens 96]

Three engines on the same model: plain decoding; EAGLE with the default --spec-max-batch and
deferred catch-up (`SpecConfig.defer_limit`, 64); the same with defer_limit = 0, which feeds every
owed entry at every step (the behaviour before deferral). At concurrency above --spec-max-batch the EAGLE engines
decode plainly, so any gap to the plain engine is the cost of keeping the head ready. EOS is
ignored so every request decodes --max-tokens tokens. Rounds alternate the engines' order.
Writes bench/results/deferred-catch-up-<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from bench.environment import write_result
from eagle_core import LLM, EngineConfig, SamplingParams
from eagle_core.config import SpecConfig

PROMPTS = [
    "Explain how a refrigerator works.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of inflation?",
    "Give me a recipe for a vegetable soup.",
    "Describe the water cycle for a child.",
    "Write a Python function that checks for palindromes.",
    "What should I pack for a week of hiking?",
    "Summarize the history of the printing press.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--draft", default="eagle_core/heads/smollm2-135m-eagle")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    spec = SpecConfig(draft=args.draft)  # the server's defaults, --spec-max-batch included
    engines = {
        "plain": LLM(args.model, dtype=args.dtype, draft=None),
        "eagle_deferred": LLM(args.model, dtype=args.dtype, config=EngineConfig(spec=spec)),
        "eagle_every_step": LLM(args.model, dtype=args.dtype, config=EngineConfig(
            spec=dataclasses.replace(spec, defer_limit=0))),
    }
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    rates: dict[int, dict[str, list[float]]] = {c: {name: [] for name in engines} for c in args.concurrency}
    for llm in engines.values():  # warm-up
        llm.chat([[{"role": "user", "content": PROMPTS[0]}]], params)
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for c in args.concurrency:
            convs = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(c)]
            for name in order:
                llm = engines[name]
                start = time.perf_counter()
                outs = llm.chat(convs, params)
                seconds = time.perf_counter() - start
                rates[c][name].append(sum(len(o.token_ids) for o in outs) / seconds)
                print(f"round {r} c={c} {name}: {rates[c][name][-1]:.1f} tok/s", flush=True)

    rows = []
    for c, by_name in rates.items():
        med = {name: statistics.median(v) for name, v in by_name.items()}
        rows.append({"concurrency": c, "tok_s_median": med, "tok_s_rounds": by_name,
                     "deferred_vs_plain": med["eagle_deferred"] / med["plain"],
                     "every_step_vs_plain": med["eagle_every_step"] / med["plain"]})
        print(f"c={c}: plain {med['plain']:.1f}, deferred {med['eagle_deferred']:.1f} "
              f"({rows[-1]['deferred_vs_plain']:.3f}x), every step {med['eagle_every_step']:.1f} "
              f"({rows[-1]['every_step_vs_plain']:.3f}x)")
    payload = {"settings": vars(args), "spec_max_batch": spec.max_batch, "defer_limit": spec.defer_limit,
               "rows": rows}
    out = write_result(args.out, "deferred-catch-up", payload)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
