"""Stage a (prompts) and stage b (self-distilled responses through the engine).

Responses are written in parts of `part_size` prompts (`responses/part-NNNNN.jsonl`, each
written atomically); a rerun skips finished parts, so generation resumes where it stopped and
accumulates when `max_prompts` is raised.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import time

from eagle_core.batch import HEAD_SOURCE
from eagle_core.train.common import read_jsonl, write_jsonl
from eagle_core.train.config import TrainConfig
from eagle_core.train.prompts import make_prompts

logger = logging.getLogger(__name__)


def prompts_path(cfg: TrainConfig) -> str:
    style = cfg.prompts.style
    return os.path.join(cfg.work_dir, "prompts.jsonl" if style == "basic" else f"prompts-{style}.jsonl")


def run_prompts(cfg: TrainConfig) -> list[dict]:
    """Write (once) and return all prompts; the last num_heldout are the held-out set.

    A committed copy (`<generate.committed_dir>/<prompt file name>.gz`) is used when present:
    "self" prompts are sampled from the model, which takes minutes."""
    path = prompts_path(cfg)
    if not os.path.exists(path) and cfg.generate.committed_dir:
        committed = os.path.join(cfg.generate.committed_dir, os.path.basename(path) + ".gz")
        if os.path.exists(committed):
            write_jsonl(path, read_jsonl(committed))
            logger.info("prompts: taken from %s", committed)
    if not os.path.exists(path):
        write_jsonl(path, _make_prompts(cfg))
    rows = read_jsonl(path)
    if cfg.prompts.style == "self" and len(rows) < cfg.prompts.num_prompts:
        rows = _extend_self_prompts(cfg, rows)
        write_jsonl(path, rows)
    logger.info("prompts: %d (%d held out)", len(rows), cfg.prompts.num_heldout)
    return rows


def _make_prompts(cfg: TrainConfig, existing: list[str] = ()) -> list[dict]:
    pc = cfg.prompts
    if pc.style != "self":
        return make_prompts(pc.num_prompts, pc.seed, pc.style)
    from eagle_core import LLM
    from eagle_core.train.evaluate import mtbench_turns
    from eagle_core.train.self_prompts import make_self_prompts

    llm = LLM(model=cfg.model, dtype=cfg.dtype, config=_generation_config(cfg), draft=None)
    return make_self_prompts(
        llm, pc.num_prompts - len(existing), pc.seed, pc.self_temperature, pc.self_max_tokens,
        avoid=mtbench_turns(), existing=list(existing),
    )


def _extend_self_prompts(cfg: TrainConfig, rows: list[dict]) -> list[dict]:
    """Grow a model-written prompt set to prompts.num_prompts. The new requests go between the
    training prompts and the held-out ones, so the held-out set stays the same and the training
    prompts keep their positions (and with them their committed answer parts)."""
    train, heldout = split_prompts(cfg, rows)
    new = _make_prompts(cfg, existing=[r["prompt"] for r in rows])
    logger.info("prompts: %d model-written requests added to %d", len(new), len(rows))
    return train + new + heldout


def _generation_config(cfg: TrainConfig):
    from eagle_core import EngineConfig, SchedulerConfig

    n = cfg.generate.max_num_seqs
    return EngineConfig(scheduler=SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=max(512, 4 * n)))


def split_prompts(cfg: TrainConfig, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    n = len(rows) - cfg.prompts.num_heldout
    return rows[:n], rows[n:]


def conversation(cfg: TrainConfig, prompt: str) -> list[dict]:
    messages = []
    if cfg.generate.system_prompt:
        messages.append({"role": "system", "content": cfg.generate.system_prompt})
    messages.append({"role": "user", "content": prompt})
    return messages


def responses_dir(cfg: TrainConfig) -> str:
    return os.path.join(cfg.work_dir, "responses")


def run_generate(cfg: TrainConfig) -> None:
    from eagle_core import LLM, SamplingParams

    gen = cfg.generate
    train, _ = split_prompts(cfg, run_prompts(cfg))
    if gen.max_prompts is not None:
        train = train[: gen.max_prompts]
    parts = [train[i : i + gen.part_size] for i in range(0, len(train), gen.part_size)]
    out_dir = responses_dir(cfg)
    _unpack_committed(gen.committed_dir, out_dir, gen.first_part + len(parts))
    todo = [p for p in range(len(parts)) if not os.path.exists(_part_path(out_dir, gen.first_part + p))]
    logger.info("generate: %d parts of %d prompts, %d to do", len(parts), gen.part_size, len(todo))
    if not todo:
        return
    # Plain decoding unless on-policy answers are asked for: the target alone writes the same
    # text distribution, and a head would only cost time.
    config = _generation_config(cfg)
    if gen.draft is not None:
        # every step drafts with the head alone, so each answer token is the head's or a miss
        config = dataclasses.replace(config, spec=dataclasses.replace(config.spec, max_batch=0, lookup_tokens=0))
    llm = LLM(model=cfg.model, dtype=cfg.dtype, config=config, draft=gen.draft)
    for p in todo:
        temperature = gen.temperatures[p % len(gen.temperatures)]
        params = SamplingParams(temperature=temperature, max_tokens=gen.max_tokens, seed=p,
                                token_sources=gen.draft is not None)
        start = time.time()
        outs = llm.chat([conversation(cfg, row["prompt"]) for row in parts[p]], params, use_tqdm=True)
        rows = [
            {
                "id": row["id"],
                "category": row["category"],
                "prompt": row["prompt"],
                "temperature": temperature,
                "response": out.text,
                "num_tokens": len(out.token_ids),
                "token_ids": list(out.token_ids),
                "finish_reason": out.finish_reason,
            }
            | ({"drafted": [int(src == HEAD_SOURCE) for src in out.token_sources or []]}
               if gen.draft is not None else {})
            for row, out in zip(parts[p], outs)
        ]
        write_jsonl(_part_path(out_dir, gen.first_part + p), rows)
        num_tokens = sum(r["num_tokens"] for r in rows)
        elapsed = time.time() - start
        logger.info(
            "part %d: %d tokens in %.0f s (%.1f tok/s)",
            gen.first_part + p, num_tokens, elapsed, num_tokens / elapsed,
        )


def load_responses(cfg: TrainConfig) -> list[dict]:
    rows: list[dict] = []
    for path in sorted(glob.glob(os.path.join(responses_dir(cfg), "part-*.jsonl"))):
        rows.extend(read_jsonl(path))
    return rows


def _unpack_committed(committed_dir: str | None, out_dir: str, num_parts: int) -> None:
    """Copy committed parts 0..num_parts-1 (gzipped JSONL) into the work dir, so they are not
    generated again. Lower part numbers may hold other prompt styles' answers (see
    generate.first_part); they are trained on too."""
    if not committed_dir or not os.path.isdir(committed_dir):
        return
    for p in range(num_parts):
        src = os.path.join(committed_dir, f"part-{p:05d}.jsonl.gz")
        dst = _part_path(out_dir, p)
        if os.path.exists(src) and not os.path.exists(dst):
            write_jsonl(dst, read_jsonl(src))
            logger.info("part %d: taken from %s", p, src)


def _part_path(out_dir: str, p: int) -> str:
    return os.path.join(out_dir, f"part-{p:05d}.jsonl")
