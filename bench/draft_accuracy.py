"""How often draft heads' first token matches the target's greedy token on MT-bench answers, split
by how sure the target itself is, and at a sampling temperature how much of the target's
probability mass the head's first drafts cover against what a perfect head would.

    .venv/bin/python -m bench.draft_accuracy [--draft HEAD_DIR ...] [--dtype float32]
        [--questions 80] [--max-tokens 96] [--temperature 1]

The target answers each MT-bench first turn greedily (as the eval stage does), then reads prompt
and answer teacher-forced. Each head's first draft step at every answer position (the entry that
reads token q+1 and the target's features at q) is compared with the target's argmax at q+1,
which is what a root child must match to be accepted at T=0. At `--temperature T` > 0 the
answers are sampled (seeded) and each position also gets the probability that the root's
children are accepted: the target's mass at temperature T on the head's top 1 (a chain) and top 3
(the default trees' root), next to the same for the target's own top 1 and top 3, which is what
a perfect head would reach with those children (deterministic children are accepted exactly when
the sampled token is one of them). Their ratio is the share of the reachable first-level
acceptance the head captures; the rest of the loss at T > 0 is the target's own spread.
Positions are grouped by the target's top-1 probability there: where the target barely prefers
its argmax, a small head predicting it is close to a coin toss, so the split shows how much of
the miss rate lies where a better head could still recover it; the confident positions are split
again into word pieces that continue a word and the rest. Writes bench/results/draft-accuracy-<date>-<machine>.json.
"""

from __future__ import annotations

import argparse
import os

import torch
from tqdm.auto import tqdm

from bench.environment import write_result
from bench.workloads import mt_bench_questions
from eagle_core import LLM, SamplingParams
from eagle_core.config import ModelConfig
from eagle_core.spec.draft_head import Eagle3Head, load_draft_head
from eagle_core.worker.loader import load_model

CONFIDENCE_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.0)
TOP_K = 3
"""The root's children in the default trees: a match within the head's top 3 can be accepted."""


def answers(model: str, dtype: str, questions: list[str], max_tokens: int,
            temperature: float = 0.0, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt, answer) token ids per question, through the engine (no draft head); greedy at
    temperature 0, else sampled with `seed`. Eager: only the tokens matter here, and compiling
    would take minutes."""
    llm = LLM(model, dtype=dtype, draft=None, compile="off")
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens,
                            seed=seed if temperature > 0 else None)
    outs = llm.chat([[{"role": "user", "content": q}] for q in questions], params, use_tqdm=True)
    return [(out.prompt_token_ids, out.token_ids) for out in outs]


def continues_word(tokenizer, token_ids: torch.Tensor) -> torch.Tensor:
    """[m] bool: the token, decoded alone, starts with a letter (no space or newline first), so
    it continues the word before it (a word piece such as "ud" in "trudged")."""
    return torch.tensor([tokenizer.decode([int(t)])[:1].isalpha() for t in token_ids], dtype=torch.bool)


@torch.inference_mode()
def score_positions(target, heads: dict[str, Eagle3Head], prompt: list[int], answer: list[int],
                    temperature: float = 0.0):
    """Per answer position: the target's top-1 probability and greedy token, and per head (top-1 hit, top-3 hit,
    whether the target's token is in the head's draft vocabulary at all), each [m]. At
    `temperature` > 0 also the target's mass at that temperature on its own top 1 and top 3
    ("oracle_mass", [m, 2]) and per head on the head's top 1 and top 3 (a fourth column, [m, 2])."""
    ids = torch.tensor(prompt + answer)[None]  # [1, n]
    out = target.model(input_ids=ids, output_hidden_states=True)
    target_logits = target.lm_head(out.last_hidden_state[0]).float()  # [n, V]
    probs = torch.softmax(target_logits, dim=-1)  # [n, V]
    top_prob, greedy = probs.max(dim=-1)  # [n] each
    n, first = ids.shape[1], len(prompt) - 2  # entry q predicts token q + 2; the answer's first is at len(prompt)
    truth = greedy[first + 1 : n - 1]  # [m]
    rows = {"confidence": top_prob[first + 1 : n - 1], "truth": truth}  # at q + 1, [m] each
    sampled = None
    if temperature > 0:
        sampled = torch.softmax(target_logits[first + 1 : n - 1] / temperature, dim=-1)  # [m, V]
        own = sampled.topk(TOP_K, dim=-1).values.cumsum(-1)  # [m, TOP_K]
        rows["oracle_mass"] = torch.stack([own[:, 0], own[:, -1]], dim=-1)  # [m, 2]
    positions = torch.arange(n - 1)[None]
    for name, head in heads.items():
        features = head.features_from_hidden_states(out.hidden_states)  # [1, n, feature]
        hidden = head(ids[:, 1:], features[:, :-1], positions)  # [1, n - 1, h], causal
        logits = head.logits(hidden[0, first : n - 2])  # [m, draft_vocab]
        top = head.draft_to_target(logits.topk(TOP_K, dim=-1).indices)  # [m, TOP_K]
        rows[name] = (top[:, 0] == truth, (top == truth[:, None]).any(-1), head.t2d[truth])
        if sampled is not None:
            mass = sampled.gather(-1, top).cumsum(-1)  # [m, TOP_K]
            rows[name] += (torch.stack([mass[:, 0], mass[:, -1]], dim=-1),)
    return rows


def _subset(mask: torch.Tensor, top1: torch.Tensor, top3: torch.Tensor, in_vocab: torch.Tensor) -> dict:
    """Share of positions in `mask` ([m] bool) and the head's rates there."""
    return {"share": mask.float().mean().item(), "top1": top1[mask].mean().item(),
            "top3": top3[mask].mean().item(), "in_draft_vocab": in_vocab[mask].mean().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--draft", nargs="+", default=["eagle_core/heads/smollm2-135m-eagle"])
    parser.add_argument("--questions", type=int, default=80)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample the answers at this temperature and report the mass the drafts cover")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()

    questions = [q.turns[0] for q in mt_bench_questions()[: args.questions]]
    sequences = answers(args.model, args.dtype, questions, args.max_tokens, args.temperature, args.seed)
    loaded = load_model(ModelConfig(model=args.model, dtype=args.dtype), attn_implementation="sdpa")
    target = loaded.model
    heads = {}
    for path in args.draft:
        head = load_draft_head(path, target.config, target.get_input_embeddings(),
                               target.get_output_embeddings(), target.dtype, "cpu")
        heads[os.path.basename(path.rstrip("/"))] = head

    columns = 4 if args.temperature > 0 else 3
    confidence, continues, oracle = [], [], []
    hits = {name: tuple([] for _ in range(columns)) for name in heads}
    for prompt, answer in tqdm(sequences, desc="scoring"):
        rows = score_positions(target, heads, prompt, answer, args.temperature)
        confidence.append(rows["confidence"])
        if args.temperature > 0:
            oracle.append(rows["oracle_mass"])
        continues.append(continues_word(loaded.tokenizer, rows["truth"]))
        for name in heads:
            for column, values in zip(hits[name], rows[name]):
                column.append(values)
    confidence, continues = torch.cat(confidence), torch.cat(continues)
    sure = confidence >= 0.9
    bins = [(lo, hi, (confidence >= lo) & ((confidence < hi) if hi < 1 else (confidence <= hi)))
            for lo, hi in zip(CONFIDENCE_EDGES, CONFIDENCE_EDGES[1:])]
    result = {"settings": vars(args), "num_positions": len(confidence), "heads": {},
              "bins": [{"range": [lo, hi], "share": in_bin.float().mean().item()} for lo, hi, in_bin in bins]}
    if oracle:
        oracle_mass = torch.cat(oracle).mean(0)  # [2]: top 1, top 3
        result["oracle_mass"] = {"top1": oracle_mass[0].item(), "top3": oracle_mass[1].item()}
    for name in heads:
        top1, top3, in_vocab = (torch.cat(column).float() for column in hits[name][:3])
        per_bin = []
        for _, _, in_bin in bins:
            count = int(in_bin.sum())
            per_bin.append({"top1": top1[in_bin].mean().item() if count else None,
                            "top3": top3[in_bin].mean().item() if count else None,
                            "misses_share": ((1 - top1) * in_bin).sum().item() / max(1.0, (1 - top1).sum().item())})
        result["heads"][name] = {
            "top1": top1.mean().item(), "top3": top3.mean().item(), "by_bin": per_bin,
            # where the target is >= 0.9 sure, word pieces that continue a word against the rest
            "sure_word_pieces": _subset(sure & continues, top1, top3, in_vocab),
            "sure_other": _subset(sure & ~continues, top1, top3, in_vocab),
            # a token outside the draft vocabulary can never be drafted: a miss whatever the head
            "outside_draft_vocab": 1 - in_vocab.mean().item(),
            "misses_outside_draft_vocab": ((1 - in_vocab) * (1 - top1)).sum().item() / max(1.0, (1 - top1).sum().item()),
            "high_confidence_top3_misses_outside_draft_vocab": (
                ((1 - in_vocab) * (1 - top3) * sure).sum().item() / max(1.0, ((1 - top3) * sure).sum().item())),
        }
        if oracle:
            mass = torch.cat(hits[name][3]).mean(0)  # [2]: top 1, top 3
            result["heads"][name]["mass"] = {"top1": mass[0].item(), "top3": mass[1].item()}

    print(f"{len(confidence)} answer positions, {len(sequences)} questions")
    header = "target top-1 prob " + " ".join(f"{lo:.1f}-{hi:.1f}".rjust(9) for lo, hi in zip(CONFIDENCE_EDGES, CONFIDENCE_EDGES[1:]))
    print(header)
    print("share of positions" + " ".join(f"{b['share']:9.2f}" for b in result["bins"]))
    for name, r in result["heads"].items():
        print(f"{name}: top-1 {r['top1']:.3f}, top-3 {r['top3']:.3f}; target token outside the draft "
              f"vocabulary at {r['outside_draft_vocab']:.3f} of positions, {r['misses_outside_draft_vocab']:.2f} "
              f"of top-1 misses, {r['high_confidence_top3_misses_outside_draft_vocab']:.2f} of top-3 misses "
              f"where the target is >= 0.9 sure")
        print("  top-1 match     " + " ".join(f"{b['top1']:9.2f}" if b["top1"] is not None else " " * 9 for b in r["by_bin"]))
        print("  top-3 match     " + " ".join(f"{b['top3']:9.2f}" if b["top3"] is not None else " " * 9 for b in r["by_bin"]))
        print("  share of misses " + " ".join(f"{b['misses_share']:9.2f}" for b in r["by_bin"]))
        for key in ("sure_word_pieces", "sure_other"):
            b = r[key]
            print(f"  target >= 0.9 sure, {key[5:].replace('_', ' ')}: {b['share']:.3f} of positions, top-1 "
                  f"{b['top1']:.2f}, top-3 {b['top3']:.2f}, in the draft vocabulary {b['in_draft_vocab']:.2f}")
    if oracle:
        o = result["oracle_mass"]
        print(f"at T={args.temperature:g}, probability that the root's children are accepted "
              f"(top 1 / top 3): a perfect head {o['top1']:.3f} / {o['top3']:.3f}")
        for name, r in result["heads"].items():
            m = r["mass"]
            print(f"  {name}: {m['top1']:.3f} / {m['top3']:.3f} "
                  f"({m['top1'] / o['top1']:.2f} / {m['top3'] / o['top3']:.2f} of a perfect head's)")
    print(f"wrote {write_result(args.out, 'draft-accuracy', result)}")


if __name__ == "__main__":
    main()
