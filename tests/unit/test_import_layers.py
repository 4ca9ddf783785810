"""Imports run one way: server -> eagle_core; inside eagle_core the scheduler side never touches
tensors or the worker, and nothing imports the training package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def py_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_eagle_core_never_imports_the_server_or_web_libraries():
    banned = ("server", "fastapi", "pydantic", "prometheus_client", "sse_starlette", "uvicorn")
    for path in py_files("eagle_core"):
        bad = {m for m in imports_of(path) if m.split(".")[0] in banned}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_scheduler_side_is_pure_python():
    for name in ("scheduler.py", "kv.py", "request.py", "batch.py", "config.py", "sampling_params.py"):
        path = ROOT / "eagle_core" / name
        bad = {m for m in imports_of(path) if m.split(".")[0] in ("torch", "numpy", "transformers") or m.startswith("eagle_core.worker")}
        assert not bad, f"{name} imports {bad}"


def test_worker_never_imports_the_scheduler():
    for path in py_files("eagle_core/worker") + py_files("eagle_core/spec"):
        bad = {m for m in imports_of(path) if m in ("eagle_core.scheduler", "eagle_core.engine")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_nothing_outside_training_imports_it():
    for path in py_files("eagle_core") + py_files("server"):
        if "train" in path.relative_to(ROOT).parts:
            continue
        bad = {m for m in imports_of(path) if m.startswith("eagle_core.train")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
