"""How long the server takes to start: cold (empty compile cache) and warm (the cache the cold
start left), for EAGLE (the defaults), plain decoding and eager forwards.

    .venv/bin/python -m bench.startup [--configs eagle,plain,eager] [--model smollm2] [--machine NAME]

Each configuration gets a fresh inductor cache directory (TORCHINDUCTOR_CACHE_DIR, which the
server keeps when set) and is started twice on it: first cold, then warm. A start is timed from
the process launch to /health answering 200 (warm-up, including compilation, ends before that),
then one short chat request (8 tokens, T=0) is timed, and the server is stopped. The model is
resolved (a GGUF converted under the cache root) before the first start, so no start pays for
that.

Output: a table on stdout and bench/results/startup-<date>-<host>[-<machine>].json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench import environment
from bench.client import REPO_ROOT, stream_chat
from bench.peers import Launch, PeerProcess, comma_names, git_revision, request_body

CONFIGS = {
    "eagle": [],
    "plain": ["--no-speculation"],
    "eager": ["--compile", "off"],
}


async def time_start(launch: Launch, log_path: Path, timeout_s: float) -> dict:
    """Start `launch`, wait until it is ready, time one short request, stop it."""
    server = PeerProcess(launch, log_path)
    async with httpx.AsyncClient(trust_env=False, timeout=None) as client:
        started = time.perf_counter()
        server.start()
        try:
            model = await server.wait_ready(client, timeout_s)
            ready_s = time.perf_counter() - started
            sent = time.perf_counter()
            await stream_chat(client, server, "first", request_body(model, [{"role": "user", "content": "Say hello."}], 8))
            first_request_s = time.perf_counter() - sent
        finally:
            server.stop()
    return {"ready_s": round(ready_s, 1), "first_request_s": round(first_request_s, 3), "port": server.port,
            "log": str(log_path)}


def markdown(results: dict) -> str:
    machine = results["machine"]
    lines = [
        f"# Server start-up: {results['settings']['machine']} ({machine['cpu']}, {machine['cpu_count']} CPUs), {results['date']}",
        "",
        f"`--model {results['settings']['model']}`, commit {results['settings']['revision']}. Seconds from launch to "
        "/health 200; then one 8-token chat request.",
        "",
        "| configuration | flags | cold: ready | cold: first request | warm: ready | warm: first request |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in results["configs"]:
        cold, warm = row["cold"], row["warm"]
        lines.append(f"| {row['name']} | `{' '.join(row['flags']) or '(defaults)'}` | {cold['ready_s']} s | "
                     f"{cold['first_request_s']} s | {warm['ready_s']} s | {warm['first_request_s']} s |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    p.add_argument("--model", default="smollm2", help="the server's --model (default: smollm2)")
    p.add_argument("--server-args", default="", help="extra flags for every start, one string")
    p.add_argument("--timeout", type=float, default=900, help="seconds to wait for a start (default: 900)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="output directory")
    p.add_argument("--machine", default=None, help="machine name, appended to the file names")
    args = p.parse_args(argv)
    args.configs = comma_names(p, args.configs, CONFIGS, "configurations")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from eagle_core.worker.loader import _resolve_model

    _resolve_model(args.model)  # converts a GGUF once, outside the timed starts
    logs = Path(tempfile.mkdtemp(prefix="startup-bench-logs-"))
    print(f"server logs: {logs}", flush=True)
    rows = []
    for name in args.configs:
        flags = [*CONFIGS[name], *shlex.split(args.server_args)]
        cache = Path(tempfile.mkdtemp(prefix=f"startup-bench-inductor-{name}-"))
        argv = [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", "{port}", "--model", args.model,
                "--log-level", "warning", *flags]
        launch = Launch(name, argv, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)}, cwd=REPO_ROOT)
        row = {"name": name, "flags": flags, "inductor_cache": str(cache)}
        for kind in ("cold", "warm"):
            row[kind] = asyncio.run(time_start(launch, logs / f"{name}-{kind}.log", args.timeout))
            print(f"{name} {kind}: ready after {row[kind]['ready_s']} s, first request {row[kind]['first_request_s']} s",
                  flush=True)
        rows.append(row)
    results = {"schema": "startup/1", "date": time.strftime("%Y-%m-%d"),
               "settings": {"model": args.model, "machine": environment.machine_name(args.machine),
                            "revision": git_revision(REPO_ROOT)}, "configs": rows}
    json_path, md_path = environment.write_result_and_markdown(str(args.out), "startup", results, args.machine, markdown)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
