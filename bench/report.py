"""The markdown tables of a serve_bench result (the .md file next to the .json)."""

from __future__ import annotations

SPEC, BASE = "eagle", "baseline"


def _f(value, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}{suffix}"


def _pcts(summary: dict, keys=("p50", "p90", "p99")) -> str:
    return " / ".join(_f(summary.get(k), 0 if (summary.get(k) or 0) >= 100 else 1) for k in keys)


def _sweep_temperature(row: dict, results: dict) -> float:
    """A sweep row's temperature (results from before sweeps at several temperatures carry one
    in their settings)."""
    return row.get("temperature", results["settings"].get("sweep_temperature", 0.0))


def sweep_temperatures(results: dict) -> list[float]:
    """The sweep's temperatures, in the order they ran."""
    return list(dict.fromkeys(_sweep_temperature(row, results) for row in results["sweep"]))


def sweep_rows(results: dict, temperature: float) -> list[dict]:
    return [row for row in results["sweep"] if _sweep_temperature(row, results) == temperature]


def markdown(results: dict) -> str:
    s = results["settings"]
    m = results["machine"]
    timing = results.get("timing", {})
    lines = [
        f"# eagle-serve benchmark: {results['started_at'][:10]}, {m['name']}" + (" (quick)" if s.get("quick") else ""),
        "",
        f"- machine: {m['cpu']} ({m['cpu_count']} cores, {m['memory_gb']} GB)" + (f", GPU {m['gpu']}" if m.get("gpu") else ""),
        f"- model `{s['model']}`, dtype {s.get('resolved_dtype', s['dtype'])}, device {s.get('resolved_device', s['device'])};"
        f" draft `{s['draft']}`; tree {s['tree']['num_draft_tokens']} tokens, depth {s['tree']['depth']},"
        f" top-k {s['tree']['top_k']}"
        + (f", up to {s['tree']['lookup_tokens']} context-lookup tokens" if s["tree"].get("lookup_tokens") else "")
        + (f" (EAGLE server flags: `{s['spec_args']}`)" if s.get("spec_args") else ""),
        f"- max_tokens {s['max_tokens']}" + (" (EOS ignored)" if s.get("ignore_eos") else ", stopping at EOS")
        + f"; MT-bench {s['mt_bench_questions']} questions x {s.get('mt_bench_turns', 2)} turn(s), HumanEval {s['humaneval_problems']} problems;"
        f" commit {results['versions'].get('git_commit')}",
        f"- wall time {_f(timing.get('wall_time_s', 0) / 60, 1)} min (servers up {_f(timing.get('startup_s'), 0)} s,"
        f" batch 1 {_f(timing.get('batch1_s', 0) / 60, 1)} min, sweep {_f(timing.get('sweep_s', 0) / 60, 1)} min)",
        "",
        "Speedup = EAGLE tokens/s / baseline (`--no-speculation`) tokens/s, both servers up together and run",
        "alternately. tau = mean acceptance length (tokens per target forward). Latencies in ms,",
        "p50 / p90 / p99; per-token latency splits each chunk's gap over its tokens (docs/benchmarks.md).",
        "",
        "## Batch 1",
        "",
        "| workload | T | baseline tok/s | EAGLE tok/s | speedup | tau | TTFT p50 base / EAGLE | per-token base | per-token EAGLE | same text |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["batch1"]:
        b, e = row[BASE], row[SPEC]
        lines.append(
            f"| {row['workload']} ({e['num_requests']}) | {row['temperature']:g} | {_f(b['tokens_per_s'])} | {_f(e['tokens_per_s'])}"
            f" | **{_f(row['speedup'], 2, 'x')}** | {_f(e['acceptance_length'], 2)}"
            f" | {_f(b['ttft_ms']['p50'], 0)} / {_f(e['ttft_ms']['p50'], 0)}"
            f" | {_pcts(b['per_token_ms'])} | {_pcts(e['per_token_ms'])} | {_f(row['same_text'], 2)} |"
        )
    for temperature in sweep_temperatures(results):
        lines += [
            "",
            f"## Concurrency sweep (T={temperature:g}, {s['requests_per_client']} requests per client)",
            "",
            "| clients | baseline tok/s | EAGLE tok/s | ratio | tau | TTFT p50 / p99 base | TTFT p50 / p99 EAGLE | per-token base | per-token EAGLE |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sweep_rows(results, temperature):
            b, e = row[BASE], row[SPEC]
            lines.append(
                f"| {row['concurrency']} | {_f(b['tokens_per_s'])} | {_f(e['tokens_per_s'])} | **{_f(row['speedup'], 2, 'x')}**"
                f" | {_f(e['acceptance_length'], 2)} | {_pcts(b['ttft_ms'], ('p50', 'p99'))} | {_pcts(e['ttft_ms'], ('p50', 'p99'))}"
                f" | {_pcts(b['per_token_ms'])} | {_pcts(e['per_token_ms'])} |"
            )
    if results.get("reference"):
        lines += [
            "",
            "## Reference rows (batch 1, T=0, the same prompts)",
            "",
            "| engine | prompts | tok/s | baseline server / it | EAGLE server / it |",
            "|---|---|---|---|---|",
        ]
        for row in results["reference"]:
            name = {"hf_generate": "HF `generate` (in-process)", "llama_cpp": "llama.cpp (same GGUF)"}.get(row["row"], row["row"])
            lines.append(
                f"| {name} | {row['num_prompts']} | {_f(row['tokens_per_s'])} | {_f(row[f'{BASE}_vs_' + row['row']], 2, 'x')}"
                f" | {_f(row[f'{SPEC}_vs_' + row['row']], 2, 'x')} |"
            )
    lines += ["", "## Acceptance by depth", ""]
    phases = results.get("acceptance_by_depth")
    if phases:
        depth = max(len(p["rate_by_depth"]) for p in phases)
        lines.append("| phase | drafted steps | " + " | ".join(f"depth {k + 1}" for k in range(depth)) + " |")
        lines.append("|---" * (depth + 2) + "|")
        for p in phases:
            rates = [_f(r, 2) for r in p["rate_by_depth"]] + ["-"] * (depth - len(p["rate_by_depth"]))
            lines.append(f"| {p['phase']} | {p['num_drafts']:.0f} | " + " | ".join(rates) + " |")
        lines.append("")
        lines.append("Share of drafted steps whose accepted path reached each depth (from /metrics).")
    else:
        lines.append(results.get("acceptance_by_depth_note") or "unavailable")
    files = results.get("files", {})
    plots = [(k, v) for k, v in files.items() if v.endswith(".png")]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{k}]({v})" for k, v in plots]
    if results.get("errors"):
        lines += ["", "## Errors", ""] + [f"- {e}" for e in results["errors"]]
    return "\n".join(lines) + "\n"
