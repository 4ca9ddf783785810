"""Session-scoped real server processes on loopback: started once, waited for until /health
says 200, killed at the end. Logs go to a file whose tail is shown if a server fails to start."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server_process import API_KEY, ServerProcess, start_server, stop_server


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """The default model, fp32 (so greedy text does not depend on batch composition)."""
    log = tmp_path_factory.mktemp("smollm2_server") / "server.log"
    server = start_server(["--dtype", "float32", "--device", "cpu", "--max-num-seqs", "32"], log)
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory, tiny_llama_dir) -> Iterator[ServerProcess]:
    """A tiny random model behind every limit the error tests need: an API key (from the
    environment), a 4 KiB body limit, one running and one waiting sequence (so a burst gets
    429), and the fault-injection hook (so a marked prompt makes the engine raise -> 500)."""
    log = tmp_path_factory.mktemp("tiny_server") / "server.log"
    entry = [sys.executable, str(Path(__file__).with_name("fault_injection.py"))]
    server = start_server(
        [
            "--model",
            str(tiny_llama_dir),
            "--served-model-name",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--max-request-bytes",
            "4096",
            "--max-num-seqs",
            "1",
            "--max-waiting",
            "1",
        ],
        log,
        api_key=API_KEY,
        entry=entry,
    )
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_llama_dir) -> Path:
    """A random-weight EAGLE-1 head for the tiny llama (drafts are mostly rejected, which is
    fine: the server tests need speculation to run, not to be fast)."""
    import torch
    from transformers import AutoModelForCausalLM

    from eagle_core.spec.draft_head import EagleHead, draft_config_from_target, save_draft_head

    target = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
    torch.manual_seed(0)
    head = EagleHead(
        draft_config_from_target(target.config), target.model.embed_tokens, target.lm_head
    )
    path = tmp_path_factory.mktemp("tiny_draft")
    save_draft_head(head, str(path))
    return path


@pytest.fixture(scope="session")
def tiny_spec_server(tmp_path_factory, tiny_llama_dir, tiny_draft_dir) -> Iterator[ServerProcess]:
    """The tiny model with a draft head, configured through a YAML file plus flags."""
    root = tmp_path_factory.mktemp("tiny_spec_server")
    config = root / "server.yaml"
    config.write_text(
        f"model: {tiny_llama_dir}\ndraft: {tiny_draft_dir}\nnum_draft_tokens: 8\n"
        "draft_depth: 3\ndraft_top_k: 2\nspec_max_batch: 0\ndevice: cpu\ndtype: float32\n"
    )
    server = start_server(
        ["--config", str(config), "--served-model-name", "tiny"], root / "server.log"
    )
    yield server
    stop_server(server)
