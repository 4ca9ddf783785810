"""Closed-loop clients in one process: the server's sweep without HTTP, interleaved.

    .venv/bin/python -m bench.closed_loop [--concurrency 2 4] [--rounds 4] [--per-round 6]
        [--spec-max-batch N] [--lookup-max-batch N]

Each of C "clients" keeps one request in flight: as soon as an answer ends (EOS or --max-tokens),
the next MT-bench first turn is added, as `bench.serve_bench`'s concurrency sweep does over HTTP.
Answers end at different times, so the running count dips below C and, with the default
--spec-max-batch, the EAGLE engine speculates in those gaps and decodes plainly otherwise. Two
engines on the same model (plain, and EAGLE with the server's defaults or the given
--spec-max-batch); each round runs the same --per-round questions through both, the order
alternating. Comparing this with the HTTP
sweep separates the engine's behaviour from the server's. Writes
bench/results/closed-loop-<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import time

from bench.environment import write_result
from bench.workloads import mt_bench_questions
from eagle_core import LLM, EngineConfig, SamplingParams
from eagle_core.config import SpecConfig
from eagle_core.worker.loader import dtype_name


def closed_loop(llm: LLM, prompts: list[str], concurrency: int, params: SamplingParams, tag: str) -> dict:
    """Run `prompts` with `concurrency` requests in flight; tokens, seconds and engine steps."""
    engine = llm.engine
    queue = [engine.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
    live: set[str] = set()
    tokens = steps = 0
    start = time.perf_counter()
    while queue or live:
        while queue and len(live) < concurrency:
            request_id = f"{tag}-{len(queue)}"
            engine.add_request(request_id, queue.pop(0), params)
            live.add(request_id)
        for out in engine.step():
            tokens += len(out.new_token_ids)
            if out.finished:
                live.discard(out.request_id)
        steps += 1
    return {"tokens": tokens, "seconds": time.perf_counter() - start, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--draft", default="eagle_core/heads/smollm2-135m-eagle")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=6, help="questions per round")
    parser.add_argument("--first", type=int, default=10, help="index of the first MT-bench question")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--spec-max-batch", type=int, default=None,
                        help="the EAGLE engine's --spec-max-batch (default: the hardware's)")
    parser.add_argument("--lookup-max-batch", type=int, default=None,
                        help="the EAGLE engine's --lookup-max-batch (default: the hardware's)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    engines = {
        "plain": LLM(args.model, dtype=args.dtype, draft=None),
        "eagle": LLM(args.model, dtype=args.dtype,
                     config=EngineConfig(spec=SpecConfig(draft=args.draft, max_batch=args.spec_max_batch,
                                                         lookup_max_batch=args.lookup_max_batch))),
    }
    warm = SamplingParams(temperature=0, max_tokens=8)
    for llm in engines.values():
        llm.chat([[{"role": "user", "content": "Hello!"}]] * 2, warm)
    questions = [q.turns[0] for q in mt_bench_questions()]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    rows = []
    for concurrency in args.concurrency:
        totals = {name: {"tokens": 0, "seconds": 0.0, "steps": 0} for name in engines}
        before = engines["eagle"].engine.spec_counters.num_drafts
        for r in range(args.rounds):
            first = args.first + r * args.per_round
            prompts = questions[first : first + args.per_round]
            names = list(engines) if r % 2 == 0 else list(engines)[::-1]
            for name in names:
                result = closed_loop(engines[name], prompts, concurrency, params, f"c{concurrency}r{r}")
                for key in totals[name]:
                    totals[name][key] += result[key]
        rates = {name: t["tokens"] / t["seconds"] for name, t in totals.items()}
        row = {"concurrency": concurrency, **{f"{name}_tok_s": rate for name, rate in rates.items()},
               "eagle_vs_plain": rates["eagle"] / rates["plain"],
               "eagle_drafted_steps": engines["eagle"].engine.spec_counters.num_drafts - before,
               "totals": totals}
        rows.append(row)
        print(f"c={concurrency}: plain {rates['plain']:.1f} tok/s, eagle {rates['eagle']:.1f} tok/s, "
              f"{row['eagle_vs_plain']:.2f}x ({row['eagle_drafted_steps']} drafted sequence-steps)", flush=True)
    spec = engines["eagle"].engine.config.spec
    settings = {**vars(args), "tree": [spec.num_draft_tokens, spec.depth, spec.top_k],
                "lookup_tokens": spec.lookup_tokens, "spec_max_batch": spec.max_batch,
                "lookup_max_batch": spec.lookup_max_batch,
                "dtype_resolved": dtype_name(engines["eagle"].engine.worker.dtype)}
    out = write_result(args.out, "closed-loop", {"settings": settings, "rows": rows})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
