"""Which draft head an engine loads (explicit, none, or the shipped head of the default model)
and which draft tree it runs when none is given."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from eagle_core.config import (
    AUTO_DRAFT,
    NARROW_TREE,
    WIDE_TREE,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SpecConfig,
)
from eagle_core.worker import worker


def config(model: str, draft) -> EngineConfig:
    return EngineConfig(model=ModelConfig(model=model), spec=SpecConfig(draft=draft))


def test_auto_uses_the_shipped_head_for_the_default_model_only(tmp_path, monkeypatch):
    shipped = tmp_path / "head"
    shipped.mkdir()
    (shipped / "config.json").write_text("{}")
    monkeypatch.setattr(worker, "SHIPPED_DRAFT_DIR", shipped)
    assert worker.resolve_draft(config("smollm2", AUTO_DRAFT)) == str(shipped)
    assert worker.resolve_draft(config("/models/other", AUTO_DRAFT)) is None


def test_auto_without_a_shipped_head_decodes_plainly(tmp_path, monkeypatch):
    monkeypatch.setattr(worker, "SHIPPED_DRAFT_DIR", tmp_path / "missing")
    assert worker.resolve_draft(config("smollm2", AUTO_DRAFT)) is None


def test_explicit_choices_are_kept():
    assert worker.resolve_draft(config("smollm2", None)) is None
    assert worker.resolve_draft(config("smollm2", "/heads/mine")) == "/heads/mine"


# ---- the draft tree: unset fields take the hardware's default

def test_unset_tree_fields_take_the_given_tree_and_set_ones_stay():
    assert SpecConfig().with_tree((8, 3, 3)) == SpecConfig(num_draft_tokens=8, depth=3, top_k=3)
    mixed = SpecConfig(num_draft_tokens=12, top_k=1).with_tree((3, 2, 2))
    assert (mixed.num_draft_tokens, mixed.depth, mixed.top_k) == (12, 2, 1)


def test_tree_fields_below_one_are_rejected():
    with pytest.raises(ValueError, match="depth must be at least 1"):
        SpecConfig(depth=0)


@pytest.mark.parametrize(
    ("device", "dtype", "native_bf16", "tree"),
    [
        ("cuda", torch.bfloat16, False, WIDE_TREE),
        ("cuda", torch.float16, False, WIDE_TREE),
        ("cpu", torch.bfloat16, True, WIDE_TREE),
        ("cpu", torch.bfloat16, False, NARROW_TREE),  # emulated bf16
        ("cpu", torch.float32, True, NARROW_TREE),
        ("cpu", torch.float32, False, NARROW_TREE),
    ],
)
def test_default_tree_is_narrow_where_a_cpu_computes_without_native_bf16(monkeypatch, device, dtype, native_bf16, tree):
    monkeypatch.setattr(worker, "cpu_has_native_bf16", lambda: native_bf16)
    assert worker.default_tree(torch.device(device), dtype) == tree


def test_derived_config_fills_the_tree_and_reserves_its_slots():
    model_config = LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                               max_position_embeddings=256)
    cpu = torch.device("cpu")

    def derive(spec: SpecConfig) -> EngineConfig:  # KV for one full sequence + 4 slots
        cache = CacheConfig(kv_cache_tokens=256 + 4, block_size=1)
        return worker.derive_config(EngineConfig(cache=cache, spec=spec), model_config, torch.float32, cpu)

    spec = derive(SpecConfig()).spec
    assert (spec.num_draft_tokens, spec.depth, spec.top_k) == NARROW_TREE  # 3 slots fit
    with pytest.raises(ValueError, match="cannot hold one full-length sequence"):
        derive(SpecConfig(num_draft_tokens=8))  # an explicit size survives, and needs 8
