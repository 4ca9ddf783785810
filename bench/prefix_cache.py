"""Prefix caching over HTTP: the default server against `--no-prefix-caching`, same flags otherwise.

    .venv/bin/python -m bench.prefix_cache [--conversations 12] [--max-tokens 200]
        [--clients 16] [--shared-requests 32] [--system-tokens 1000] [--machine NAME]

Two workloads, both servers started once and kept up:
- Two-turn chats, one at a time: MT-bench's first turn, then its second turn after the first
  answer (the conversation resent, as chat clients do). The servers take turns per
  conversation, the first of them alternating. Per turn: time to first token, the server's
  mean acceptance length (`spec_decode`), and `usage.prompt_tokens_details.cached_tokens`.
- A shared system prompt of about --system-tokens tokens before every MT-bench first turn,
  --clients closed-loop clients, --shared-requests requests in all, each server in turn:
  output tokens/s and time to first token.
T=0 throughout. Extra server flags go after `--` (e.g. `-- --dtype float32`).
Writes bench/results/prefix-cache-<date>-<machine>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.client import ServerProcess, chat_body, stream_chat, tokenize_messages
from bench.environment import run_http_bench
from bench.workloads import mt_bench_questions

CACHE, NO_CACHE = "prefix-caching", "no-prefix-caching"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def system_prompt(client: httpx.AsyncClient, server: ServerProcess, tokens: int) -> str:
    """A system message of about `tokens` tokens: MT-bench's questions as reference material."""
    text = "You answer questions about the reference material below.\n\n"
    for question in mt_bench_questions():
        for turn in question.turns:
            if len(await tokenize_messages(client, server, [{"role": "system", "content": text}])) >= tokens:
                return text
            text += turn.strip() + "\n\n"
    return text


def ttft(record) -> float:
    return record.chunk_times[0] - record.sent_at if record.chunk_times else record.latency


async def two_turns(client, servers, args) -> list[dict]:
    rows = []
    for i, question in enumerate(mt_bench_questions()[: args.conversations]):
        order = [CACHE, NO_CACHE] if i % 2 == 0 else [NO_CACHE, CACHE]
        for name in order:
            messages = [{"role": "user", "content": question.turns[0]}]
            body = chat_body(messages, args.max_tokens, 0.0, None, False)
            first = await stream_chat(client, servers[name], question.id, body)
            messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": question.turns[1]}]
            second = await stream_chat(client, servers[name], question.id,
                                       chat_body(messages, args.max_tokens, 0.0, None, False))
            rows.append({"server": name, "question": question.id, **{
                f"{turn}_{key}": value for turn, record in (("first", first), ("second", second)) for key, value in (
                    ("ttft_s", ttft(record)), ("prompt_tokens", record.prompt_tokens),
                    ("cached_tokens", record.cached_tokens), ("completion_tokens", record.completion_tokens),
                    ("acceptance_length", (record.spec_decode or {}).get("mean_acceptance_length")),
                    ("text", record.text))}})
        log(f"conversation {i + 1}/{args.conversations}: second-turn TTFT "
            + ", ".join(f"{r['server']} {r['second_ttft_s'] * 1e3:.0f} ms" for r in rows[-2:]))
    return rows


async def shared_system(client, server: ServerProcess, system: str, args) -> dict:
    questions = [q.turns[0] for q in mt_bench_questions()]
    queue = list(range(args.shared_requests))
    records = []

    async def client_loop() -> None:
        while queue:
            i = queue.pop(0)
            messages = [{"role": "system", "content": system}, {"role": "user", "content": questions[i % len(questions)]}]
            records.append(await stream_chat(client, server, f"shared-{i}", chat_body(messages, args.shared_max_tokens, 0.0, None, False)))

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(args.clients)))
    wall = time.perf_counter() - start
    ttfts = sorted(ttft(r) for r in records)
    return {
        "server": server.name, "requests": len(records), "wall_s": wall,
        "output_tok_s": sum(r.completion_tokens for r in records) / wall,
        "ttft_p50_s": statistics.median(ttfts), "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))],
        "prompt_tokens": sum(r.prompt_tokens for r in records), "cached_tokens": sum(r.cached_tokens for r in records),
    }


def summarize(rows: list[dict], shared: list[dict]) -> dict:
    by = {name: [r for r in rows if r["server"] == name] for name in (CACHE, NO_CACHE)}

    def median(name, key):
        values = [r[key] for r in by[name] if r[key] is not None]
        return statistics.median(values) if values else None

    summary = {name: {key: median(name, key) for key in (
        "first_ttft_s", "second_ttft_s", "second_prompt_tokens", "second_cached_tokens", "first_acceptance_length",
        "second_acceptance_length")} for name in by}
    pairs = [(a["second_ttft_s"], b["second_ttft_s"]) for a, b in zip(by[CACHE], by[NO_CACHE])]
    summary["second_ttft_ratio_median"] = statistics.median(a / b for a, b in pairs) if pairs else None
    summary["same_text"] = sum(a["second_text"] == b["second_text"] and a["first_text"] == b["first_text"]
                               for a, b in zip(by[CACHE], by[NO_CACHE])) / max(len(pairs), 1)
    summary["shared_system"] = shared
    return summary


def render(result: dict) -> str:
    s, settings = result["summary"], result["settings"]
    lines = [f"# Prefix caching ({result['machine'].get('cpu', '')})", "",
             f"Command: `{settings['command']}`", "",
             f"Two-turn MT-bench chats, one at a time, T=0, up to {settings['max_tokens']} tokens per answer, "
             f"{settings['conversations']} conversations (medians):", "",
             "| server | turn-1 TTFT ms | turn-2 TTFT ms | turn-2 prompt tokens | cached | turn-1 tau | turn-2 tau |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in (CACHE, NO_CACHE):
        r = s[name]
        tau = [f"{v:.2f}" if v is not None else "-" for v in (r["first_acceptance_length"], r["second_acceptance_length"])]
        lines.append(f"| {name} | {r['first_ttft_s'] * 1e3:.0f} | {r['second_ttft_s'] * 1e3:.0f} | "
                     f"{r['second_prompt_tokens']:.0f} | {r['second_cached_tokens']:.0f} | {tau[0]} | {tau[1]} |")
    lines += ["", f"Turn-2 TTFT with the cache over without, median of per-conversation ratios: "
              f"{s['second_ttft_ratio_median']:.2f}; identical answers in {s['same_text']:.0%} of conversations.", "",
              f"A shared system prompt of {settings['system_tokens']} tokens, {settings['clients']} clients, "
              f"{settings['shared_requests']} requests, up to {settings['shared_max_tokens']} tokens each:", "",
              "| server | output tok/s | TTFT p50 ms | TTFT p90 ms | prompt tokens | cached |", "|---|---:|---:|---:|---:|---:|"]
    for r in s["shared_system"]:
        lines.append(f"| {r['server']} | {r['output_tok_s']:.1f} | {r['ttft_p50_s'] * 1e3:.0f} | {r['ttft_p90_s'] * 1e3:.0f} | "
                     f"{r['prompt_tokens']} | {r['cached_tokens']} |")
    return "\n".join(lines) + "\n"


async def run(args, extra: list[str]) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="prefix-cache-"))
    servers = {CACHE: ServerProcess(CACHE, list(extra), logs / "cache.log"),
               NO_CACHE: ServerProcess(NO_CACHE, [*extra, "--no-prefix-caching"], logs / "no-cache.log")}
    async with httpx.AsyncClient() as client:
        try:
            for server in servers.values():  # one at a time: each measures its step costs at start-up
                server.start()
                await server.wait_healthy(client, args.start_timeout)
            log("servers up")
            warm = chat_body([{"role": "user", "content": "Hello!"}], 8, 0.0, None, False)
            for server in servers.values():
                await stream_chat(client, server, "warm", warm)
            rows = await two_turns(client, servers, args)
            system = await system_prompt(client, servers[CACHE], args.system_tokens)
            shared = []
            for name in (NO_CACHE, CACHE):
                shared.append(await shared_system(client, servers[name], system, args))
                log(f"shared system prompt, {name}: {shared[-1]['output_tok_s']:.1f} tok/s, "
                    f"TTFT p50 {shared[-1]['ttft_p50_s'] * 1e3:.0f} ms")
        finally:
            for server in servers.values():
                server.stop()
    return {"rows": rows, "summary": summarize(rows, shared)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--shared-requests", type=int, default=32)
    parser.add_argument("--shared-max-tokens", type=int, default=64)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--start-timeout", type=float, default=900)
    parser.add_argument("--machine", default=None)
    parser.add_argument("--out", default="bench/results")
    run_http_bench("prefix-cache", "bench.prefix_cache", parser, run, render)


if __name__ == "__main__":
    main()
