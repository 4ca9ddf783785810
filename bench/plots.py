"""PNG plots of a serve_bench result (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

from bench.report import sweep_rows, sweep_temperatures  # noqa: E402

SPEC, BASE = "eagle", "baseline"
COLORS = {SPEC: "tab:orange", BASE: "tab:blue"}


def write_all(results: dict, out_dir: Path, stem: str) -> dict[str, Path]:
    paths = {
        "speedup_plot": out_dir / f"{stem}-speedup.png",
        "latency_plot": out_dir / f"{stem}-latency.png",
        "acceptance_plot": out_dir / f"{stem}-acceptance.png",
    }
    speedup(results, paths["speedup_plot"])
    latency(results, paths["latency_plot"])
    acceptance(results, paths["acceptance_plot"])
    return paths


def _title(results: dict) -> str:
    s = results["settings"]
    return f"{s['model']} ({s.get('resolved_dtype', s['dtype'])}, {s.get('resolved_device', s['device'])}), {results['machine']['name']}"


def speedup(results: dict, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs: list[int] = []
    for temperature, style in zip(sweep_temperatures(results), ("o-", "s--", "^:", "v-.")):
        sweep = [r for r in sweep_rows(results, temperature) if r[BASE]["tokens_per_s"] and r[SPEC]["tokens_per_s"]]
        xs = sorted({*xs, *(r["concurrency"] for r in sweep)})
        points = [r["concurrency"] for r in sweep]
        for server in (BASE, SPEC):
            ax1.plot(points, [r[server]["tokens_per_s"] for r in sweep], style, color=COLORS[server],
                     label=f"{server}, T={temperature:g}")
        ax2.plot(points, [r["speedup"] for r in sweep], style, color=COLORS[SPEC], label=f"sweep, T={temperature:g}")
    ax1.set(xscale="log", xlabel="concurrent streaming clients", ylabel="total output tokens/s", title="Throughput")
    batch1 = [r for r in results["batch1"] if r["workload"] == "all" and r["speedup"]]
    for r, marker in zip(batch1, "xD^v+*"):
        ax2.scatter([1], [r["speedup"]], marker=marker, s=50, color="black",
                    label=f"batch 1, all prompts, T={r['temperature']:g}")
    ax2.axhline(1.0, color="grey", lw=1, ls="--")
    ax2.set(xscale="log", xlabel="concurrent streaming clients", ylabel="EAGLE / baseline", title="Speedup")
    for ax in (ax1, ax2):
        if xs:
            ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(_title(results), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def latency(results: dict, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    # left: batch-1 percentiles per workload at the first temperature
    rows = [r for r in results["batch1"] if r["workload"] in ("mt_bench", "humaneval")]
    if rows:
        temperature = rows[0]["temperature"]
        rows = [r for r in rows if r["temperature"] == temperature]
        labels, width = [], 0.2
        groups = [(r["workload"], q) for r in rows for q in ("p50", "p90", "p99")]
        for i, server in enumerate((BASE, SPEC)):
            values = [
                next(r for r in rows if r["workload"] == w)[server]["per_token_ms"][q] or 0 for w, q in groups
            ]
            ax1.bar([j + (i - 0.5) * width * 2 for j in range(len(groups))], values, width * 2,
                    color=COLORS[server], label=server)
        labels = [f"{w}\n{q}" for w, q in groups]
        ax1.set_xticks(range(len(groups)), labels, fontsize=7)
        ax1.set(ylabel="per-token latency (ms)", title=f"Batch 1, T={temperature:g}")
        ax1.legend(fontsize=8)
    # right: per-token latency and TTFT against concurrency, at the sweep's first temperature
    temperatures = sweep_temperatures(results)
    sweep = sweep_rows(results, temperatures[0]) if temperatures else []
    xs = [r["concurrency"] for r in sweep]
    for server in (BASE, SPEC):
        for q, style in (("p50", "o-"), ("p99", "o--")):
            ax2.plot(xs, [r[server]["per_token_ms"][q] for r in sweep], style, color=COLORS[server],
                     label=f"{server} per-token {q}")
        ax2.plot(xs, [r[server]["ttft_ms"]["p50"] for r in sweep], "s:", color=COLORS[server], alpha=0.6,
                 label=f"{server} TTFT p50")
    title = f"Latency under load, T={temperatures[0]:g}" if temperatures else "Latency under load"
    ax2.set(xscale="log", yscale="log", xlabel="concurrent streaming clients", ylabel="ms", title=title)
    if xs:
        ax2.set_xticks(xs, [str(x) for x in xs])
    ax2.minorticks_off()
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(_title(results), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def acceptance(results: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    phases = results.get("acceptance_by_depth")
    if phases:
        depth = max(len(p["rate_by_depth"]) for p in phases)
        width = 0.8 / len(phases)
        for i, p in enumerate(phases):
            rates = [r or 0 for r in p["rate_by_depth"]]
            ax.bar([k + 1 + (i - (len(phases) - 1) / 2) * width for k in range(len(rates))], rates, width, label=p["phase"])
        ax.set(xlabel="tree depth (draft tokens accepted in a step)", ylabel="share of drafted steps reaching it",
               title="Acceptance by tree depth", ylim=(0, 1))
        ax.set_xticks(range(1, depth + 1))
        ax.legend(fontsize=8)
    else:
        # no per-depth counters on /metrics: mean acceptance length per workload instead
        rows = [r for r in results["batch1"] if r["workload"] in ("mt_bench_turn1", "mt_bench_turn2", "humaneval")]
        labels = [f"{r['workload']}\nT={r['temperature']:g}" for r in rows]
        ax.bar(range(len(rows)), [r[SPEC]["acceptance_length"] or 0 for r in rows], color=COLORS[SPEC])
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set(ylabel="mean acceptance length (tokens per target forward)",
               title="Mean acceptance length (per-depth counters not on /metrics)")
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(_title(results), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def closed_loop(results: dict, path: Path) -> None:
    """A bench.closed_loop result: tokens/s by clients per temperature (left), each EAGLE
    variant over plain decoding (right)."""
    rows = results["rows"]
    variants = results["settings"]["variants"]
    temperatures = sorted({r["temperature"] for r in rows})
    colors = dict(zip(variants, ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for t, style in zip(temperatures, ("-", "--", ":")):
        own = [r for r in rows if r["temperature"] == t]
        xs = [r["concurrency"] for r in own]
        ax1.plot(xs, [r["plain_tok_s"] for r in own], "o" + style, color=COLORS[BASE], label=f"plain, T={t:g}")
        for name in variants:
            ax1.plot(xs, [r[f"{name}_tok_s"] for r in own], "o" + style, color=colors[name], label=f"{name}, T={t:g}")
            ax2.plot(xs, [r[f"{name}_vs_plain"] for r in own], "o" + style, color=colors[name], label=f"{name}, T={t:g}")
    ax1.set(xscale="log", xlabel="closed-loop clients", ylabel="total output tokens/s", title="Throughput")
    ax2.axhline(1.0, color="grey", lw=1, ls="--")
    ax2.axhline(0.98, color="grey", lw=1, ls=":")
    ax2.set(xscale="log", xlabel="closed-loop clients", ylabel="EAGLE / plain", title="Against plain decoding")
    xs = sorted({r["concurrency"] for r in rows})
    for ax in (ax1, ax2):
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    m = results["machine"]
    fig.suptitle(f"{results['settings']['model']} ({results['settings'].get('dtype_resolved', '')}), "
                 f"{m['cpu']}, {m['cpu_count']} cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
