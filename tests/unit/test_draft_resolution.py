"""Which draft head an engine loads (explicit, none, or the shipped head of the default model)
and which draft tree it runs when none is given."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from eagle_core.config import (
    AUTO_DRAFT,
    NARROW_SPEC,
    WIDE_SPEC,
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


# ---- the draft tree: unset fields take the hardware's defaults; who drafts stays the policy's

def test_unset_fields_take_the_defaults_and_set_ones_stay():
    assert SpecConfig().with_defaults(WIDE_SPEC) == SpecConfig(num_draft_tokens=8, depth=3, top_k=3, lookup_tokens=8)
    assert SpecConfig().with_defaults(WIDE_SPEC).max_batch is None  # the policy chooses
    mixed = SpecConfig(num_draft_tokens=12, top_k=1, max_batch=0, lookup_tokens=0).with_defaults(NARROW_SPEC)
    assert (mixed.num_draft_tokens, mixed.depth, mixed.top_k, mixed.max_batch, mixed.lookup_tokens,
            mixed.lookup_max_batch) == (12, 2, 1, 0, 0, None)


@pytest.mark.parametrize(("field", "value"), [("depth", 0), ("num_draft_tokens", 0), ("max_batch", -1),
                                             ("lookup_tokens", -1), ("lookup_max_batch", -1)])
def test_out_of_range_fields_are_rejected(field, value):
    with pytest.raises(ValueError, match=f"{field} must be at least"):
        SpecConfig(**{field: value})


@pytest.mark.parametrize(
    ("device", "dtype", "native_bf16", "defaults"),
    [
        ("cuda", torch.bfloat16, False, WIDE_SPEC),
        ("cuda", torch.float16, False, WIDE_SPEC),
        ("cpu", torch.bfloat16, True, WIDE_SPEC),
        ("cpu", torch.bfloat16, False, NARROW_SPEC),  # emulated bf16
        ("cpu", torch.float32, True, NARROW_SPEC),
        ("cpu", torch.float32, False, NARROW_SPEC),
    ],
)
def test_defaults_are_narrow_where_a_cpu_computes_without_native_bf16(monkeypatch, device, dtype, native_bf16, defaults):
    monkeypatch.setattr(worker, "cpu_has_native_bf16", lambda: native_bf16)
    assert worker.spec_defaults(torch.device(device), dtype) == defaults


def test_derived_config_fills_the_defaults_and_reserves_the_tree_slots():
    model_config = LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                               max_position_embeddings=256)
    cpu = torch.device("cpu")

    def derive(spec: SpecConfig) -> EngineConfig:  # KV for one full sequence + 12 slots
        cache = CacheConfig(kv_cache_tokens=256 + 12, block_size=1)
        return worker.derive_config(EngineConfig(cache=cache, spec=spec), model_config, torch.float32, cpu)

    spec = derive(SpecConfig()).spec
    assert (spec.num_draft_tokens, spec.depth, spec.top_k, spec.lookup_tokens) == NARROW_SPEC
    assert spec.max_batch is None and spec.lookup_max_batch is None
    # 3 + 8 slots fit; an explicit size survives, and 8 + 8 do not
    with pytest.raises(ValueError, match="cannot hold one full-length sequence"):
        derive(SpecConfig(num_draft_tokens=8))
    assert derive(SpecConfig(num_draft_tokens=8, lookup_tokens=0)).spec.num_draft_tokens == 8
    # without a draft head no slot is held: KV for exactly one full sequence is enough
    exact = CacheConfig(kv_cache_tokens=256, block_size=1)
    worker.derive_config(EngineConfig(cache=exact, spec=SpecConfig(draft=None)), model_config, torch.float32, cpu)
    with pytest.raises(ValueError, match="cannot hold one full-length sequence"):
        worker.derive_config(EngineConfig(cache=exact, spec=SpecConfig()), model_config, torch.float32, cpu)
