"""The serving benchmark: EAGLE against plain decoding, over HTTP, in one run on one machine.

    .venv/bin/python -m bench.serve_bench [--quick] [--draft DIR] [--model M] [--dtype D] ...
    make bench            # full run
    make bench-quick      # a few prompts, a few minutes

One run starts two real servers on the same model and dtype, one with the draft head and one
with --no-speculation, both up for the whole run, and drives them with the same streamed chat
requests, alternating which server goes first per prompt (batch 1) and per sweep point
(concurrency), so machine drift cancels in the ratios:

1. batch 1 at each temperature (0 and 1): MT-bench's questions, both turns (turn 2 carries the
   plain server's own turn-1 answer, so both servers get the same prompt), then HumanEval;
2. a concurrency sweep (1, 2, 4, ... closed-loop streaming clients) on MT-bench first turns and
   HumanEval prompts at each --sweep-temperatures value (the servers' order alternating per
   point);
3. reference rows at batch 1, T=0, on an evenly spaced subset of the batch-1 prompts,
   interleaved with the servers' runs of the same prompts: transformers' generate in this
   process (same model, dtype, device), and llama.cpp on the same GGUF when llama-cpp-python
   is importable.

Output: bench/results/<date>-<machine>[-quick].json (machine, versions, settings, wall time,
every number), .md (the tables) and -speedup.png, -latency.png, -acceptance.png.
docs/benchmarks.md explains every number.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import hashlib
import json
import shlex
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from bench import environment, stats, workloads
from bench.client import (
    REPO_ROOT,
    ServerProcess,
    StreamRecord,
    chat_body,
    scrape_metrics,
    stream_chat,
    tokenize_messages,
)

SPEC, BASE = "eagle", "baseline"
PER_POS_METRIC = "eagle_spec_decode_num_accepted_tokens_per_pos_total"
NUM_DRAFTS_METRIC = "eagle_spec_decode_num_drafts_total"
QUICK = {
    "mt_bench_questions": 3,
    "humaneval_problems": 2,
    "max_tokens": 64,
    "concurrency": [1, 2, 4, 8],
    "requests_per_client": 2,
    "reference_prompts": 4,
}
# 128 output tokens give every request >= 100 decode steps, enough for stable per-request rates,
# and keep the full run near an hour on a 2-core CPU (72 min measured; 256 was estimated at 3+ hours);
# GPU runs can raise it with --max-tokens.
FULL = {
    "mt_bench_questions": 80,
    "humaneval_problems": 164,
    "max_tokens": 128,
    "concurrency": [1, 2, 4, 8, 16, 32],
    "requests_per_client": 4,
    "reference_prompts": 24,
}


# ----------------------------------------------------------------------------- options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.serve_bench",
        description="EAGLE vs --no-speculation over HTTP: batch-1 speed and latency, a concurrency "
        "sweep, HF generate (and llama.cpp) reference rows; JSON, markdown and PNG plots.",
    )
    p.add_argument("--quick", action="store_true", help="few prompts and short answers (a few minutes): "
                   + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--model", default="smollm2", help="model spec, as the server's --model (default: smollm2)")
    p.add_argument("--dtype", default="auto", help="dtype of both servers and of HF generate (default: auto)")
    p.add_argument("--device", default="auto", help="device of both servers and of HF generate (default: auto)")
    p.add_argument("--draft", default=None, help="draft head directory (default: the head the server ships for --model, if any)")
    p.add_argument("--max-tokens", type=int, default=None, help=f"max output tokens per request (full {FULL['max_tokens']})")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, metavar="N",
                   help=f"sweep points (full {FULL['concurrency']})")
    p.add_argument("--requests-per-client", type=int, default=None,
                   help=f"requests per sweep point = concurrency x this (full {FULL['requests_per_client']})")
    p.add_argument("--mt-bench-questions", type=int, default=None, help="first N MT-bench questions (full: all 80)")
    p.add_argument("--mt-bench-turns", type=int, choices=(1, 2), default=2,
                   help="batch-1 MT-bench turns per question (1: first turns only, half the time; default 2)")
    p.add_argument("--humaneval-problems", type=int, default=None, help="first N HumanEval problems (full: all 164)")
    p.add_argument("--reference-prompts", type=int, default=None,
                   help=f"batch-1 prompts also run through HF generate / llama.cpp (full {FULL['reference_prompts']}; 0: none)")
    p.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 1.0],
                   help="batch-1 temperatures (default: 0 1; none: no batch-1 phase)")
    p.add_argument("--sweep-temperatures", "--sweep-temperature", type=float, nargs="+", default=[0.0],
                   help="temperatures of the sweep, each a full sweep (default: 0)")
    p.add_argument("--seed", type=int, default=1234, help="base of the per-prompt seeds used when T > 0")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp row even if llama-cpp-python is importable")
    p.add_argument("--server-args", default="", help="extra flags for both servers, one string (e.g. '--max-num-seqs 64')")
    p.add_argument("--spec-args", default="", help="extra flags for the EAGLE server only (e.g. '--num-draft-tokens 32')")
    p.add_argument("--startup-timeout", type=float, default=900, help="seconds to wait for /health")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output directory")
    p.add_argument("--machine", default=None, help="machine name in the file names (default: host name)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.draft is None:
        args.draft = default_draft(args.model)
        if args.draft is None:
            p.error(f"--draft is required: eagle-serve ships no draft head for {args.model!r}")
    if not Path(args.draft).exists():
        p.error(f"--draft {args.draft}: no such directory")
    return args


def default_draft(model: str) -> str | None:
    """The head the server itself would load for `model` with its default --draft ('auto': the
    head shipped in eagle_core/heads for the default model), or None when there is none."""
    from eagle_core.config import EngineConfig, ModelConfig
    from eagle_core.worker.worker import resolve_draft

    return resolve_draft(EngineConfig(model=ModelConfig(model=model)))


# ----------------------------------------------------------------------------- the run


class Bench:
    def __init__(self, args: argparse.Namespace, client: httpx.AsyncClient, servers: dict[str, ServerProcess]):
        self.args = args
        self.client = client
        self.servers = servers
        self.records: list[dict] = []  # {"phase", "workload", "temperature", "concurrency", "record"}
        self.reference_runs: list[dict] = []
        self.errors: list[str] = []
        self.acceptance_phases: list[dict] = []
        self.references = []  # HFGenerate / LlamaCpp instances
        self._flip = 0
        self._batch1_start: float | None = None

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    def order(self) -> list[str]:
        """Which server goes first alternates, so neither always runs on a warmer machine."""
        self._flip += 1
        return [SPEC, BASE] if self._flip % 2 else [BASE, SPEC]

    async def one(
        self, server: str, prompt_id: str, messages: list[dict], phase: dict, seed: int | None
    ) -> StreamRecord | None:
        body = _chat_body(messages, self.args.max_tokens, phase["temperature"], seed, self.args.ignore_eos)
        body["cache_salt"] = cache_salt(phase)
        try:
            return await stream_chat(self.client, self.servers[server], prompt_id, body)
        except Exception as err:  # one failed request should not lose hours of results
            self.errors.append(f"{server} {prompt_id} T={phase['temperature']}: {type(err).__name__}: {err}")
            self.log(f"error: {self.errors[-1]}")
            return None

    async def pair(self, phase: dict, prompt_id: str, messages: list[dict], seed: int | None, reference: bool) -> dict[str, StreamRecord | None]:
        """Run one prompt on both servers (alternating order), then on the reference rows."""
        got: dict[str, StreamRecord | None] = {}
        for server in self.order():
            got[server] = await self.one(server, prompt_id, messages, phase, seed)
            if got[server] is not None:
                self.records.append({**phase, "record": got[server]})
        if reference and self.references and phase["temperature"] == 0.0:  # greedy rows only
            try:
                prompt_ids = await tokenize_messages(self.client, self.servers[BASE], messages)
                for ref in self.references:
                    run = ref.run(prompt_id, prompt_ids, self.args.max_tokens, self.args.ignore_eos)
                    self.reference_runs.append({"row": ref.name, "prompt_id": prompt_id, **dataclasses.asdict(run)})
            except Exception as err:
                self.errors.append(f"reference {prompt_id}: {type(err).__name__}: {err}")
                self.log(f"error: {self.errors[-1]}")
        return got

    async def metrics_counters(self) -> dict | None:
        try:
            samples = await scrape_metrics(self.client, self.servers[SPEC])
        except Exception:
            return None
        per_pos = {}
        drafts = 0.0
        for (name, labels), value in samples.items():
            label = dict(labels)
            if name == PER_POS_METRIC and "position" in label:
                per_pos[int(label["position"])] = per_pos.get(int(label["position"]), 0.0) + value
            elif name == NUM_DRAFTS_METRIC:
                drafts += value
        return {"per_pos": per_pos, "num_drafts": drafts} if per_pos else None

    async def measure_acceptance(self, name: str, before: dict | None) -> None:
        after = await self.metrics_counters()
        if before is None or after is None:
            return
        positions = sorted(after["per_pos"])
        accepted = [after["per_pos"][k] - before["per_pos"].get(k, 0.0) for k in positions]
        drafts = after["num_drafts"] - before["num_drafts"]
        self.acceptance_phases.append({
            "phase": name,
            "positions": positions,
            "accepted_per_pos": accepted,
            "num_drafts": drafts,
            "rate_by_depth": stats.acceptance_by_depth(accepted, drafts),
        })

    # ------------------------------------------------------------------ phases

    async def batch1(self, questions, code, reference_ids: set[str]) -> None:
        self._batch1_start = time.perf_counter()
        turns = self.args.mt_bench_turns
        total = (turns * len(questions) + len(code)) * len(self.args.temperatures)
        done = 0
        for temperature in self.args.temperatures:
            seed_of = (lambda i: self.args.seed + i) if temperature > 0 else (lambda i: None)
            before = await self.metrics_counters()
            for i, q in enumerate(questions):
                turn1 = workloads.first_turn(q)
                phase = {"phase": "batch1", "workload": "mt_bench_turn1", "temperature": temperature, "concurrency": 1}
                got = await self.pair(phase, q.id + "/turn1", turn1, seed_of(2 * i), q.id + "/turn1" in reference_ids)
                done += 1
                if turns == 2:
                    if got[BASE] is None:
                        self.errors.append(f"{q.id}/turn2 T={temperature}: skipped (no turn-1 answer)")
                    else:
                        turn2 = workloads.second_turn(q, got[BASE].text)
                        phase = {**phase, "workload": "mt_bench_turn2"}
                        await self.pair(phase, q.id + "/turn2", turn2, seed_of(2 * i + 1), q.id + "/turn2" in reference_ids)
                    done += 1
                self.progress(f"batch 1, T={temperature:g}", done, total)
            await self.measure_acceptance(f"mt_bench T={temperature:g}", before)
            before = await self.metrics_counters()
            for i, c in enumerate(code):
                phase = {"phase": "batch1", "workload": "humaneval", "temperature": temperature, "concurrency": 1}
                await self.pair(phase, c.id, list(c.messages), seed_of(10_000 + i), c.id in reference_ids)
                done += 1
                self.progress(f"batch 1, T={temperature:g}", done, total)
            await self.measure_acceptance(f"humaneval T={temperature:g}", before)

    def progress(self, what: str, done: int, total: int) -> None:
        if done == total or done % 5 == 0:
            elapsed = time.perf_counter() - (self._batch1_start or time.perf_counter())
            left = elapsed / done * (total - done) if done else 0.0
            self.log(f"{what}: {done}/{total} prompts, batch 1 about {left / 60:.0f} min from done")

    async def sweep(self, pool: list[tuple[str, list[dict]]]) -> None:
        for temperature in self.args.sweep_temperatures:
            before = await self.metrics_counters()
            for concurrency in self.args.concurrency:
                num_requests = concurrency * self.args.requests_per_client
                jobs = [pool[i % len(pool)] for i in range(num_requests)]
                for server in self.order():
                    await self.sweep_point(server, concurrency, temperature, jobs)
                self.log(f"sweep T={temperature:g}: concurrency {concurrency} done ({num_requests} requests per server)")
            await self.measure_acceptance(f"sweep T={temperature:g}", before)

    async def sweep_point(self, server: str, concurrency: int, temperature: float, jobs: list[tuple[str, list[dict]]]) -> None:
        """`concurrency` closed-loop clients share the job list: each sends its next request as
        soon as its previous stream ended."""
        queue = list(reversed(jobs))
        phase = {"phase": "sweep", "workload": "mixed", "temperature": temperature, "concurrency": concurrency}

        async def worker() -> None:
            while queue:
                prompt_id, messages = queue.pop()
                record = await self.one(server, prompt_id, messages, phase, None)
                if record is not None:
                    self.records.append({**phase, "record": record})

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def warm_up(self) -> None:
        messages = [{"role": "user", "content": "Say hello."}]
        for server in (SPEC, BASE):
            for _ in range(2):
                await stream_chat(self.client, self.servers[server], "warmup", _chat_body(messages, 8, 0.0, None, False))
        if self.references:
            prompt_ids = await tokenize_messages(self.client, self.servers[BASE], messages)
            for ref in self.references:
                ref.run("warmup", prompt_ids, 8)


def cache_salt(phase: dict) -> str:
    """The prefix-cache salt of a phase's requests: each phase (batch 1 at one temperature, one
    sweep point) sends prompts that earlier phases sent too, and a server that had kept their
    blocks would skip most of their prefill, which a run of distinct prompts would not. Within
    a phase blocks are shared as in any traffic (a second turn reuses its first)."""
    return f"{phase['phase']}-T{phase['temperature']:g}-c{phase['concurrency']}"


def _chat_body(messages, max_tokens, temperature, seed, ignore_eos) -> dict:
    """Seeds only matter when sampling; greedy requests go without one."""
    return chat_body(messages, max_tokens, temperature, seed if temperature > 0 else None, ignore_eos)


def reference_subset(ids: list[str], count: int) -> set[str]:
    """`count` prompt ids spread evenly over `ids` (so both workloads are represented)."""
    if count <= 0 or not ids:
        return set()
    if count >= len(ids):
        return set(ids)
    step = len(ids) / count
    return {ids[int(i * step)] for i in range(count)}


async def run(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    started_at = datetime.datetime.now().astimezone()
    # Versions (the git commit above all) as the servers load them, not as the tree is at the end
    # of a long run during which work goes on.
    versions = environment.versions()
    questions = workloads.mt_bench_questions(args.mt_bench_questions)
    code = workloads.humaneval_prompts(args.humaneval_problems)
    batch1_ids = [f"{q.id}/turn{t}" for q in questions for t in range(1, args.mt_bench_turns + 1)] + [c.id for c in code]
    reference_ids = reference_subset(batch1_ids, args.reference_prompts) if 0.0 in args.temperatures else set()

    common = ["--model", args.model, "--dtype", args.dtype, "--device", args.device,
              "--log-level", "warning", *shlex.split(args.server_args)]
    logs = Path(tempfile.mkdtemp(prefix="serve-bench-logs-"))  # kept out of bench/results
    servers = {
        SPEC: ServerProcess(SPEC, [*common, "--draft", str(args.draft), *shlex.split(args.spec_args)], logs / f"{SPEC}.log"),
        BASE: ServerProcess(BASE, [*common, "--no-speculation"], logs / f"{BASE}.log"),
    }
    limits = httpx.Limits(max_connections=max(args.concurrency) * 2 + 8, max_keepalive_connections=max(args.concurrency) * 2 + 8)
    async with httpx.AsyncClient(limits=limits, trust_env=False, timeout=None) as client:
        bench = Bench(args, client, servers)
        try:
            for server in servers.values():
                server.start()
            bench.log(f"starting servers: {SPEC} on :{servers[SPEC].port}, {BASE} on :{servers[BASE].port}"
                      f" (logs in {logs})")
            await asyncio.gather(*(s.wait_healthy(client, args.startup_timeout) for s in servers.values()))
            startup_s = time.perf_counter() - started
            bench.log(f"both servers healthy after {startup_s:.0f} s")
            bench.references = load_references(args, bench) if reference_ids else []
            await bench.warm_up()
            phase_start = time.perf_counter()
            await bench.batch1(questions, code, reference_ids)
            batch1_s = time.perf_counter() - phase_start
            phase_start = time.perf_counter()
            await bench.sweep(workloads.sweep_pool(questions, code))
            sweep_s = time.perf_counter() - phase_start
        finally:
            for server in servers.values():
                server.stop()

    bench.log("counting tokens per chunk and computing statistics")
    tokenizer = bench.references[0].tokenizer if bench.references and hasattr(bench.references[0], "tokenizer") else load_tokenizer(args.model)
    count_chunk_tokens([r["record"] for r in bench.records], tokenizer)
    results = build_results(args, bench, started_at, versions)
    results["server_logs"] = str(logs)
    results["timing"] = {
        "wall_time_s": time.perf_counter() - started,
        "startup_s": startup_s,
        "batch1_s": batch1_s,
        "sweep_s": sweep_s,
    }
    return results


def load_references(args: argparse.Namespace, bench: Bench) -> list:
    from bench.baselines import HFGenerate, LlamaCpp, gguf_path_of, llama_cpp_available

    bench.log("loading the HF generate reference in-process")
    refs: list = [HFGenerate(args.model, args.dtype, args.device)]
    if args.no_llama_cpp:
        return refs
    gguf = gguf_path_of(args.model)
    if llama_cpp_available() and gguf is not None:
        try:
            refs.append(LlamaCpp(gguf, n_ctx=8192, use_gpu=refs[0].device.type == "cuda"))
            bench.log(f"llama.cpp row on {gguf}")
        except Exception as err:
            bench.errors.append(f"llama.cpp unavailable: {type(err).__name__}: {err}")
    return refs


def load_tokenizer(model: str):
    """The model's tokenizer, resolved as the server resolves it (no weights loaded)."""
    from transformers import AutoTokenizer

    from eagle_core.worker.loader import _resolve_model

    location, local_only, _ = _resolve_model(model)
    return AutoTokenizer.from_pretrained(location, local_files_only=local_only)


def count_chunk_tokens(records: list[StreamRecord], tokenizer) -> None:
    """Tokens per content chunk: each chunk's text re-tokenized, then scaled to the server's
    exact completion-token count (usage) by stats.apportion. Done after the run, off the clock."""
    for record in records:
        if not record.chunk_texts:
            record.chunk_tokens = []
            continue
        estimates = [len(ids) for ids in tokenizer(record.chunk_texts, add_special_tokens=False)["input_ids"]]
        record.chunk_tokens = stats.apportion(estimates, record.completion_tokens)


# ----------------------------------------------------------------------------- statistics


def group_stats(records: list[StreamRecord], wall: bool = False) -> dict:
    """Speed and latency of a set of requests. Batch 1: tokens / summed request latency.
    Concurrent (`wall`): tokens / (last finish - first send)."""
    tokens = sum(r.completion_tokens for r in records)
    if wall and records:
        seconds = max(r.finished_at for r in records) - min(r.sent_at for r in records)
    else:
        seconds = sum(r.latency for r in records)
    ttfts, per_token = [], []
    for r in records:
        ttft, samples = stats.per_token_latencies(r.sent_at, r.chunk_times, r.chunk_tokens)
        if ttft is not None:
            ttfts.append(ttft)
        per_token.extend(samples)
    spec = [r.spec_decode for r in records if r.spec_decode]
    return {
        "num_requests": len(records),
        "output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": stats.rate(tokens, seconds),
        "ttft_ms": stats.summarize(ttfts, 1000),
        "per_token_ms": stats.summarize(per_token, 1000),
        "acceptance_length": stats.acceptance_length(spec),
        "finish_reasons": dict(Counter(r.finish_reason for r in records)),
    }


def compare(spec: dict, base: dict) -> dict:
    return {
        SPEC: spec,
        BASE: base,
        "speedup": stats.ratio(spec["tokens_per_s"], base["tokens_per_s"]),
    }


def build_results(args: argparse.Namespace, bench: Bench, started_at: datetime.datetime, versions: dict) -> dict:
    rows = bench.records

    def select(server: str, **match) -> list[StreamRecord]:
        return [
            r["record"] for r in rows
            if r["record"].server == server and all(
                (r[k] in v) if isinstance(v, tuple) else r[k] == v for k, v in match.items()
            )
        ]

    batch1 = []
    groups = {
        "mt_bench": ("mt_bench_turn1", "mt_bench_turn2"),
        "mt_bench_turn1": ("mt_bench_turn1",),
        "mt_bench_turn2": ("mt_bench_turn2",),
        "humaneval": ("humaneval",),
        "all": ("mt_bench_turn1", "mt_bench_turn2", "humaneval"),
    }
    for temperature in args.temperatures:
        for name, members in groups.items():
            spec = select(SPEC, phase="batch1", temperature=temperature, workload=members)
            base = select(BASE, phase="batch1", temperature=temperature, workload=members)
            if not spec and not base:
                continue
            row = {"workload": name, "temperature": temperature,
                   **compare(group_stats(spec), group_stats(base)),
                   "same_text": same_text_fraction(spec, base)}
            batch1.append(row)

    sweep = []
    for temperature in args.sweep_temperatures:
        for concurrency in args.concurrency:
            spec = select(SPEC, phase="sweep", temperature=temperature, concurrency=concurrency)
            base = select(BASE, phase="sweep", temperature=temperature, concurrency=concurrency)
            sweep.append({"temperature": temperature, "concurrency": concurrency,
                          **compare(group_stats(spec, wall=True), group_stats(base, wall=True))})

    return {
        "schema": 1,
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": environment.machine_info(args.machine),
        "versions": versions,
        "settings": settings_of(args),
        "token_counting": "per-chunk tokens = each chunk's text re-tokenized with the model's tokenizer, "
                          "scaled to the server's exact usage.completion_tokens (stream_options.include_usage)",
        "batch1": batch1,
        "sweep": sweep,
        "reference": reference_rows(bench),
        "acceptance_by_depth": bench.acceptance_phases or None,
        "acceptance_by_depth_note": None if bench.acceptance_phases else
            f"/metrics has no {PER_POS_METRIC}: acceptance by depth unavailable, mean acceptance length only",
        "requests": [request_summary(r) for r in rows],
        "errors": bench.errors,
    }


def same_text_fraction(spec: list[StreamRecord], base: list[StreamRecord]) -> float | None:
    """Share of prompts whose two answers are identical (expected ~1 at T=0: speculation is
    lossless; at T>0 identical only when seeded sampling lines up)."""
    by_id = {r.prompt_id: r.text for r in base}
    pairs = [(r.text, by_id[r.prompt_id]) for r in spec if r.prompt_id in by_id]
    return stats.ratio(sum(a == b for a, b in pairs), len(pairs))


def reference_rows(bench: Bench) -> list[dict]:
    """Each reference row next to the two servers on exactly the same prompts (batch 1, T=0)."""
    out = []
    for name in sorted({r["row"] for r in bench.reference_runs}):
        runs = [r for r in bench.reference_runs if r["row"] == name]
        ids = {r["prompt_id"] for r in runs}
        tokens = sum(r["completion_tokens"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        row = {"row": name, "num_prompts": len(runs), "output_tokens": tokens, "seconds": seconds,
               "tokens_per_s": stats.rate(tokens, seconds)}
        for server in (SPEC, BASE):
            recs = [r["record"] for r in bench.records
                    if r["phase"] == "batch1" and r["temperature"] == 0.0
                    and r["record"].server == server and r["record"].prompt_id in ids]
            row[f"{server}_tokens_per_s"] = stats.rate(sum(r.completion_tokens for r in recs), sum(r.latency for r in recs))
            row[f"{server}_vs_{name}"] = stats.ratio(row[f"{server}_tokens_per_s"], row["tokens_per_s"])
        out.append(row)
    return out


def request_summary(row: dict) -> dict:
    r: StreamRecord = row["record"]
    ttft, samples = stats.per_token_latencies(r.sent_at, r.chunk_times, r.chunk_tokens)
    return {
        "phase": row["phase"], "workload": row["workload"], "temperature": row["temperature"],
        "concurrency": row["concurrency"], "server": r.server, "prompt_id": r.prompt_id,
        "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
        "latency_s": round(r.latency, 4), "ttft_s": None if ttft is None else round(ttft, 4),
        "num_chunks": len(r.chunk_times), "finish_reason": r.finish_reason, "spec_decode": r.spec_decode,
        "text_sha1": hashlib.sha1(r.text.encode()).hexdigest()[:12],
    }


def settings_of(args: argparse.Namespace) -> dict:
    from eagle_core.config import SPEC_DEFAULTS as defaults
    from eagle_core.config import SpecConfig
    from eagle_core.worker.loader import dtype_name, resolve_device, resolve_dtype

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    device = resolve_device(args.device)  # as the servers will (they fail alike if it is absent)
    dtype = resolve_dtype(args.dtype, device)
    settings["resolved_device"] = str(device)
    settings["resolved_dtype"] = dtype_name(dtype)
    # the servers' largest tree unless --spec-args sets one
    settings["tree"] = {"num_draft_tokens": defaults.num_draft_tokens, "depth": defaults.depth, "top_k": defaults.top_k,
                        "lookup_tokens": defaults.lookup_tokens, "overridden_by_spec_args": bool(args.spec_args)}
    settings["spec_max_batch"] = SpecConfig.max_batch
    settings["lookup_max_batch"] = SpecConfig.lookup_max_batch
    settings["draft"] = str(Path(args.draft).resolve())
    return settings


# ----------------------------------------------------------------------------- output


def write_outputs(results: dict, args: argparse.Namespace) -> dict[str, Path]:
    from bench import report

    args.out.mkdir(parents=True, exist_ok=True)
    date = results["started_at"][:10]
    stem = f"{date}-{results['machine']['name']}" + ("-quick" if args.quick else "")
    paths = {"json": args.out / f"{stem}.json", "markdown": args.out / f"{stem}.md"}
    if not args.no_plots:
        from bench import plots

        paths.update(plots.write_all(results, args.out, stem))
    results["files"] = {k: str(v.relative_to(args.out)) if v.is_relative_to(args.out) else str(v) for k, v in paths.items()}
    paths["json"].write_text(json.dumps(results, indent=1) + "\n")
    paths["markdown"].write_text(report.markdown(results))
    return paths


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    paths = write_outputs(results, args)
    from bench import report

    print(report.markdown(results))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    print(f"wall time: {results['timing']['wall_time_s'] / 60:.1f} min")
    return 1 if results["errors"] and not results["batch1"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
