"""Stage c: fixed text read teacher-forced (no generation needed; ~5x cheaper per token).

Sources, all installed on the machine and permissively licensed:
  - the long descriptions (README text) in the METADATA of installed Python distributions whose
    License / License-Expression / classifiers name an accepted licence (`CorpusConfig.licenses`);
  - Python standard-library module source (PSF-2.0), as code.
Each chunk is wrapped as an assistant turn after a short user request, so its features are read
in the same chat context as served responses. Every source is recorded with its licence in
`corpus/sources.json`.
"""

from __future__ import annotations

import email
import glob
import json
import logging
import os
import random
import sysconfig

from eagle_core.train.common import atomic_write_text, write_jsonl
from eagle_core.train.config import TrainConfig

logger = logging.getLogger(__name__)


def corpus_path(cfg: TrainConfig) -> str:
    return os.path.join(cfg.work_dir, "corpus", "chunks.jsonl")


_COPYLEFT = ("GPL", "MPL", "EPL", "CDDL", "SSPL", "EUPL")
"""Licence markers that exclude a package even when a permissive licence is also named."""


def _license_of(msg) -> str:
    parts = [msg.get("License-Expression") or "", (msg.get("License") or "").split("\n")[0]]
    parts += [c for c in msg.get_all("Classifier") or [] if c.startswith("License ::")]
    return " | ".join(p.strip() for p in parts if p and p.strip())


def _package_docs(accepted: tuple[str, ...]) -> list[dict]:
    out = []
    purelib = sysconfig.get_paths()["purelib"]
    for meta in sorted(glob.glob(os.path.join(purelib, "*.dist-info", "METADATA"))):
        with open(meta, encoding="utf-8", errors="replace") as f:
            msg = email.message_from_file(f)
        body = msg.get_payload()
        if not isinstance(body, str) or len(body) < 2000:
            continue
        lic = _license_of(msg)
        if not lic or any(c in lic for c in _COPYLEFT) or not any(a.lower() in lic.lower() for a in accepted):
            continue
        out.append({
            "source": f"pypi:{msg.get('Name')}=={msg.get('Version')} (METADATA description)",
            "license": lic[:200],
            "kind": "docs",
            "name": msg.get("Name"),
            "text": body,
        })
    return out


def _stdlib_sources() -> list[dict]:
    stdlib = sysconfig.get_paths()["stdlib"]
    out = []
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        name = os.path.basename(path)[:-3]
        if name.startswith("_"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        out.append({
            "source": f"python-stdlib:{name}.py",
            "license": "PSF-2.0",
            "kind": "code",
            "name": name,
            "text": text,
        })
    return out


_DOC_ASKS = [
    "Tell me about the Python package {name}.",
    "Can you show me the documentation of {name}?",
    "What does the {name} library do? Explain with examples.",
    "Give me an overview of {name} and how to use it.",
]
_CODE_ASKS = [
    "Show me some of the Python code in the standard library module {name}.",
    "How is the Python module {name} implemented?",
    "Write Python code similar to the {name} module.",
]


def run_corpus(cfg: TrainConfig) -> None:
    path = corpus_path(cfg)
    if os.path.exists(path):
        logger.info("corpus: %s exists, skipped", path)
        return
    tokenizer = _tokenizer(cfg)
    cc = cfg.corpus
    rng = random.Random(0)
    docs, code = _package_docs(cc.licenses), _stdlib_sources()
    rng.shuffle(docs)
    rng.shuffle(code)
    budgets = {"docs": int(cc.max_tokens * 0.7), "code": cc.max_tokens - int(cc.max_tokens * 0.7)}
    chunks, sources = [], []
    for kind, items, asks in (("docs", docs, _DOC_ASKS), ("code", code, _CODE_ASKS)):
        used = 0
        for item in items:
            if used >= budgets[kind]:
                break
            ids = tokenizer(item["text"], add_special_tokens=False)["input_ids"]
            # at most 4 chunks per source, for variety
            n_used = 0
            for start in range(0, len(ids), cc.chunk_tokens):
                if n_used >= 4 or used >= budgets[kind]:
                    break
                piece = ids[start : start + cc.chunk_tokens]
                if len(piece) < 64:
                    break
                text = tokenizer.decode(piece)
                if kind == "code":
                    text = "```python\n" + text + "\n```"
                chunks.append({
                    "source": item["source"],
                    "prompt": rng.choice(asks).format(name=item["name"]),
                    "response": text,
                })
                used += len(piece)
                n_used += 1
            if n_used:
                sources.append({k: item[k] for k in ("source", "license", "kind")} | {"chunks": n_used})
        logger.info("corpus %s: %d tokens", kind, used)
    rng.shuffle(chunks)
    atomic_write_text(os.path.join(os.path.dirname(path), "sources.json"),
                      json.dumps(sources, indent=1))
    write_jsonl(path, chunks)
    logger.info("corpus: %d chunks from %d sources", len(chunks), len(sources))


def _tokenizer(cfg: TrainConfig):
    from eagle_core.config import ModelConfig
    from eagle_core.worker.loader import load_model

    return load_model(ModelConfig(model=cfg.model, dtype="float32")).tokenizer
