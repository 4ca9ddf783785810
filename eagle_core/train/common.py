"""Small helpers shared by the training stages: atomic writes, JSONL, threads."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable

import torch


def set_threads(num_threads: int) -> None:
    torch.set_num_threads(max(1, num_threads))


def atomic_write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_jsonl(path: str, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSONL file, gzipped when the name ends in .gz (the committed data parts)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def tmp_path_for(path: str) -> str:
    """A sibling temporary name; publish with os.replace(tmp, path)."""
    return f"{path}.tmp-{os.getpid()}"
