"""Batch-1 speed of draft-tree sizes against plain decoding, in one process, interleaved.

    .venv/bin/python -m bench.tree_sizes [--trees 8/3/3 8/3/3+4 12/4/4] [--first 10 --questions 10]
        [--draft-quantization int8 none] [--weight-packing auto none] [--draft HEAD_DIR [HEAD_DIR ...]]

Which tree suits a head depends on how deep its drafts survive and on what a draft step and a
wider verify cost on the machine, so the default tree (--num-draft-tokens / --draft-depth /
--draft-top-k) is picked from this measurement. One engine per tree plus a plain one, all on the
same model; each MT-bench first-turn question (T=0 unless --temperature) goes through every
engine, the order rotating from question to question so that drift in machine load spreads
evenly. "+L" after a tree adds up to L context-lookup tokens (spec/lookup.py); without it the
tree has none. Several --draft heads get an engine each per tree (heads of different sizes: what their
extra acceptance buys against their extra draft cost). Several --weight-packing values get a plain
engine and an engine per tree each; speedups are against the plain engine of the same packing
(eager engines only, `--compile off` in the server's terms: a process compiles with one packing). tau = tokens per target forward (bonus included), from the engine's per-request counters.
Writes bench/results/tree-sizes-<date>-<machine>-q<first question>-<last question>.json.
"""

from __future__ import annotations

import argparse
import os
import time
from itertools import product

from bench.environment import write_result
from bench.workloads import mt_bench_questions
from eagle_core import LLM, EngineConfig, SamplingParams
from eagle_core.config import DRAFT_QUANTIZATIONS, WEIGHT_PACKINGS, SpecConfig


def parse_tree(text: str) -> tuple[int, int, int, int]:
    """"8/3/3" -> (num_draft_tokens, depth, top_k, lookup_tokens 0); "8/3/3+4": 4 lookup tokens."""
    tree, _, lookup = text.partition("+")
    parts = tree.split("/")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or not (lookup.isdigit() or not lookup):
        raise argparse.ArgumentTypeError(
            f"tree {text!r}: expected TOKENS/DEPTH/TOPK[+LOOKUP], e.g. 8/3/3 or 8/3/3+4")
    tokens, depth, top_k = map(int, parts)
    return tokens, depth, top_k, int(lookup or 0)


def tree_name(tokens: int, depth: int, top_k: int, lookup: int) -> str:
    return f"{tokens}/{depth}/{top_k}" + (f"+{lookup}" if lookup else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--draft", nargs="+", default=["eagle_core/heads/smollm2-135m-eagle"],
                        help="draft head directories: one engine per head, tree and quantization")
    parser.add_argument("--trees", type=parse_tree, nargs="+", default=[(8, 3, 3, 0), (8, 3, 3, 4), (12, 4, 4, 0)],
                        help="TOKENS/DEPTH/TOPK[+LOOKUP]: +LOOKUP adds up to that many context-lookup tokens")
    parser.add_argument(
        "--draft-quantization", nargs="+", choices=DRAFT_QUANTIZATIONS, default=["auto"],
        help="one engine per tree and value (e.g. int8 none: the draft weights' effect)",
    )
    parser.add_argument(
        "--weight-packing", nargs="+", choices=WEIGHT_PACKINGS, default=["auto"],
        help="a plain engine and one engine per tree for each value (auto none: packing's effect; "
        "with compiled forwards one value per run)",
    )
    parser.add_argument("--first", type=int, default=10, help="index of the first MT-bench question")
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature (each question gets the same seed in every engine)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    engines, plain_of = {}, {}
    for packing in args.weight_packing:
        suffix = f" {packing}" if len(args.weight_packing) > 1 else ""
        plain = "plain" + suffix
        engines[plain] = LLM(args.model, dtype=args.dtype, draft=None, weight_packing=packing)
        plain_of[plain] = plain
        for draft, (tokens, depth, top_k, lookup), quant in product(args.draft, args.trees, args.draft_quantization):
            spec = SpecConfig(draft=draft, num_draft_tokens=tokens, depth=depth, top_k=top_k,
                              max_batch=0, draft_quantization=quant, lookup_tokens=lookup)
            name = tree_name(tokens, depth, top_k, lookup)
            if len(args.draft_quantization) > 1:
                name += f" {quant}"
            if len(args.draft) > 1:
                name += f" {os.path.basename(draft.rstrip('/'))}"
            name += suffix
            engines[name] = LLM(args.model, dtype=args.dtype, config=EngineConfig(spec=spec), weight_packing=packing)
            plain_of[name] = plain
    for llm in engines.values():  # warm-up
        llm.chat([[{"role": "user", "content": "Hello!"}]], SamplingParams(temperature=0, max_tokens=8))

    questions = mt_bench_questions()[args.first : args.first + args.questions]
    names = list(engines)
    totals = {name: {"tokens": 0, "seconds": 0.0, "steps": 0, "emitted": 0} for name in names}
    for q, question in enumerate(questions):
        shift = q % len(names)
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=q)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            out = engines[name].chat([[{"role": "user", "content": question.turns[0]}]], params)[0]
            totals[name]["seconds"] += time.perf_counter() - start
            totals[name]["tokens"] += len(out.token_ids)
            totals[name]["steps"] += out.spec.num_steps
            totals[name]["emitted"] += out.spec.num_emitted_tokens
        print(f"{q + 1}/{len(questions)} " + ", ".join(
            f"{n} {t['tokens'] / t['seconds']:.1f}" for n, t in totals.items()), flush=True)

    rows = []
    for name, t in totals.items():
        plain = totals[plain_of[name]]
        plain_rate = plain["tokens"] / plain["seconds"]
        rate = t["tokens"] / t["seconds"]
        rows.append({"tree": name, "tok_s": rate, "speedup": rate / plain_rate,
                     "tau": t["emitted"] / max(1, t["steps"]),
                     "draft_weights": engines[name].engine.worker.draft_weights,
                     "packed_weights": engines[name].engine.worker.packed_weights, **t})
        print(f"{name:>15}: {rate:.1f} tok/s, {rate / plain_rate:.2f}x, tau {rows[-1]['tau']:.2f}")
    settings = {**vars(args), "trees": [tree_name(*t) for t in args.trees]}
    span = f"-q{args.first + 1}-{args.first + len(questions)}" + (f"-T{args.temperature:g}" if args.temperature else "")
    out = write_result(args.out, "tree-sizes", {"settings": settings, "rows": rows}, suffix=span)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
