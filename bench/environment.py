"""Where a benchmark ran: the machine and the versions of everything that shapes its numbers."""

from __future__ import annotations

import datetime
import itertools
import json
import os
import platform
import re
import socket
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def machine_info(name: str | None) -> dict:
    from eagle_core.worker.loader import cpu_has_amx_bf16, cpu_has_native_bf16

    info = {
        "name": machine_name(name),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gb": memory_gb(),
        # VMs of one kind differ here (one exposed AVX512-BF16, a later one did not), and it
        # decides the dtype, the tree and what every figure means.
        "cpu_native_bf16": cpu_has_native_bf16(),
        # AMX decides whether the linears run on packed weights (--weight-packing auto).
        "cpu_amx_bf16": cpu_has_amx_bf16(),
        "gpu": None,
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return info


def machine_name(name: str | None) -> str:
    """A file-name-safe machine name: `name`, else the host name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name or socket.gethostname()).strip("-") or "machine"


def write_result(out_dir: str, stem: str, payload: dict, suffix: str = "") -> Path:
    """Write an in-process benchmark's result to <out_dir>/<stem>-<date>-<machine><suffix>.json,
    with the versions and the machine it ran on; returns the path. An earlier result of the same name is kept:
    the new one gets -2, -3, ... appended."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    name = f"{stem}-{datetime.date.today()}-{machine_name(None)}{suffix}"
    path = Path(out_dir) / f"{name}.json"
    for n in itertools.count(2):
        if not path.exists():
            break
        path = Path(out_dir) / f"{name}-{n}.json"
    payload = {"versions": versions(), "machine": machine_info(None), **payload}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def run_http_bench(stem: str, module: str, parser, run, render) -> None:
    """The main() of an HTTP benchmark: flags before `--` are the benchmark's (`parser`, which
    must have --machine and --out), those after it go to every server it starts; runs
    `run(args, server_flags)` (a coroutine function returning the result dict), writes the
    result as JSON and Markdown (`render`) and prints the Markdown."""
    import asyncio
    import sys

    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    result = asyncio.run(run(args, extra))
    settings = {**vars(args), "server_flags": extra, "command": " ".join([f"python -m {module}", *argv])}
    json_path, md_path = write_result_and_markdown(args.out, stem, {"settings": settings, **result}, args.machine, render)
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")


def write_result_and_markdown(out_dir: str, stem: str, payload: dict, machine: str | None, render) -> tuple[Path, Path]:
    """write_result with a `-<machine>` suffix when a machine was named, then `render(result)`
    (the JSON as written) beside it as .md; returns both paths."""
    suffix = f"-{machine_name(machine)}" if machine else ""
    json_path = write_result(out_dir, stem, payload, suffix=suffix)
    md_path = json_path.with_suffix(".md")
    md_path.write_text(render(json.loads(json_path.read_text())))
    return json_path, md_path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for package in ("torch", "transformers", "httpx", "eagle-serve", "llama-cpp-python", "matplotlib"):
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        out["git_commit"] = commit + ("-dirty" if dirty else "")
    except Exception:
        out["git_commit"] = None
    return out
