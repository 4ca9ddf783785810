"""Closed-loop clients in one process: the server's sweep without HTTP, interleaved.

    .venv/bin/python -m bench.closed_loop [--concurrency 1 2 4 8 16] [--temperature 0 1]
        [--variants policy pinned-1 always] [--rounds 2]

Each of C "clients" keeps one request in flight: as soon as an answer ends (EOS or --max-tokens),
the next MT-bench first turn is added, as `bench.serve_bench`'s concurrency sweep does over HTTP.
Answers end at different times, so the running count varies. Engines on the same model: plain
decoding, and one EAGLE engine per variant: "policy" (the default: the speculation policy
chooses who drafts and the trees' size), "tree-N" or "tree-N/D/K" (the policy with the tree
pinned: --num-draft-tokens N [--draft-depth D --draft-top-k K]), "pinned-N" (--spec-max-batch N --lookup-max-batch N), "always"
(--spec-max-batch 0); "+" joins them ("always+tree-3/2/2"). Each round runs the same questions (--per-round, default 2 x C, at least
6) through every engine, the order rotating. Comparing this with the HTTP sweep separates the
engine's behaviour from the server's. Writes bench/results/closed-loop-<date>-<machine>.json and its plot (.png).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

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


def variant_spec(name: str, draft: str) -> SpecConfig:
    """The EAGLE engine's SpecConfig for a variant name (see the module docstring); names joined
    by "+" combine ("always+tree-3/2/2": a fixed tree that always drafts)."""
    fields: dict = {}
    for part in name.split("+"):
        fields.update(_variant_fields(part))
    return SpecConfig(draft=draft, **fields)


def _variant_fields(name: str) -> dict:
    if name == "policy":
        return {}
    if name.startswith("tree-"):  # tree-N or tree-N/D/K
        shape = [int(x) for x in name.removeprefix("tree-").split("/")]
        return dict(zip(("num_draft_tokens", "depth", "top_k"), shape))
    if name == "always":
        return {"max_batch": 0}
    if name.startswith("pinned-"):
        limit = int(name.removeprefix("pinned-"))
        return {"max_batch": limit, "lookup_max_batch": limit}
    raise SystemExit(f"unknown variant {name!r}: policy, tree-N[/D/K], always or pinned-N, joined by +")


def tree_sizes(llm: LLM) -> dict[int, int]:
    """Steps the engine's policy let the head draft, by tree size, so far ({} without a policy)."""
    policy = llm.engine.policy
    return dict(policy.steps_by_tree_nodes) if policy is not None else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--draft", default="eagle_core/heads/smollm2-135m-eagle")
    parser.add_argument("--variants", nargs="+", default=["policy"], help="EAGLE engines: policy, tree-N, always, pinned-N")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--per-round", type=int, default=0, help="questions per round (0: 2 x C, at least 6)")
    parser.add_argument("--first", type=int, default=10, help="index of the first MT-bench question")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--machine", default=None, help="machine label for the result file")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--plot", metavar="RESULT", help="only plot an earlier result file (RESULT.png)")
    args = parser.parse_args()
    if args.plot:
        print(f"wrote {plot(Path(args.plot))}")
        return

    engines = {"plain": LLM(args.model, dtype=args.dtype, draft=None)}
    for name in args.variants:
        engines[name] = LLM(args.model, dtype=args.dtype, config=EngineConfig(spec=variant_spec(name, args.draft)))
    warm = SamplingParams(temperature=0, max_tokens=8)
    for llm in engines.values():
        llm.chat([[{"role": "user", "content": "Hello!"}]] * 2, warm)
    questions = [q.turns[0] for q in mt_bench_questions()]
    rows = []
    for temperature in args.temperature:
        params = SamplingParams(temperature=temperature, max_tokens=args.max_tokens, seed=0)
        for concurrency in args.concurrency:
            per_round = args.per_round or max(6, 2 * concurrency)
            totals = {name: {"tokens": 0, "seconds": 0.0, "steps": 0} for name in engines}
            before = {name: llm.engine.spec_counters.num_drafts for name, llm in engines.items()}
            sizes_before = {name: tree_sizes(llm) for name, llm in engines.items()}
            for r in range(args.rounds):
                first = (args.first + r * per_round) % len(questions)
                prompts = (questions[first:] + questions)[:per_round]
                names = list(engines)
                names = names[r % len(names):] + names[: r % len(names)]
                for name in names:
                    result = closed_loop(engines[name], prompts, concurrency, params, f"t{temperature}c{concurrency}r{r}")
                    for key in totals[name]:
                        totals[name][key] += result[key]
            rates = {name: t["tokens"] / t["seconds"] for name, t in totals.items()}
            row = {"temperature": temperature, "concurrency": concurrency, "questions_per_round": per_round,
                   **{f"{name}_tok_s": rate for name, rate in rates.items()},
                   **{f"{name}_vs_plain": rates[name] / rates["plain"] for name in args.variants},
                   **{f"{name}_drafted_steps": engines[name].engine.spec_counters.num_drafts - before[name]
                      for name in args.variants},
                   **{f"{name}_steps_by_tree_nodes": {n: steps - sizes_before[name].get(n, 0)
                                                      for n, steps in tree_sizes(engines[name]).items()
                                                      if steps > sizes_before[name].get(n, 0)}
                      for name in args.variants},
                   "totals": totals}
            rows.append(row)
            print(f"T={temperature} c={concurrency}: plain {rates['plain']:.1f} tok/s"
                  + "".join(f", {name} {rates[name]:.1f} ({row[f'{name}_vs_plain']:.2f}x, "
                            f"{row[f'{name}_drafted_steps']} drafted)" for name in args.variants), flush=True)
    any_engine = engines[args.variants[0]].engine if args.variants else engines["plain"].engine
    spec = any_engine.config.spec
    policy = {name: llm.engine.policy.as_dict() for name, llm in engines.items() if llm.engine.policy is not None}
    settings = {**vars(args), "tree": [spec.num_draft_tokens, spec.depth, spec.top_k],
                "lookup_tokens": spec.lookup_tokens,
                "dtype_resolved": dtype_name(any_engine.worker.dtype)}
    out = write_result(args.out, "closed-loop", {"settings": settings, "rows": rows, "policy_end": policy},
                       f"-{args.machine}" if args.machine else "")
    print(f"wrote {out} and {plot(out)}")


def plot(result: Path) -> Path:
    """Plot a result file beside it (.png)."""
    from bench import plots

    path = result.with_suffix(".png")
    plots.closed_loop(json.loads(result.read_text()), path)
    return path


if __name__ == "__main__":
    main()
