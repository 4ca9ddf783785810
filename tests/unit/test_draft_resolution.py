"""Which draft head an engine loads (explicit, none, or the shipped head of the default model)
and which draft tree it runs when none is given."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from eagle_core.config import (
    AUTO_DRAFT,
    SPEC_DEFAULTS,
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


# ---- the draft tree: unset fields take the defaults; who drafts, and how large, stays the policy's

def test_unset_fields_take_the_defaults_and_set_ones_stay():
    assert SpecConfig().with_defaults(SPEC_DEFAULTS) == SpecConfig(num_draft_tokens=8, depth=3, top_k=3, lookup_tokens=8)
    assert SpecConfig().with_defaults(SPEC_DEFAULTS).max_batch is None  # the policy chooses
    mixed = SpecConfig(num_draft_tokens=12, top_k=1, max_batch=0, lookup_tokens=0).with_defaults(SPEC_DEFAULTS)
    assert (mixed.num_draft_tokens, mixed.depth, mixed.top_k, mixed.max_batch, mixed.lookup_tokens,
            mixed.lookup_max_batch) == (12, 3, 1, 0, 0, None)


@pytest.mark.parametrize(("field", "value"), [("depth", 0), ("num_draft_tokens", 0), ("max_batch", -1),
                                             ("lookup_tokens", -1), ("lookup_max_batch", -1)])
def test_out_of_range_fields_are_rejected(field, value):
    with pytest.raises(ValueError, match=f"{field} must be at least"):
        SpecConfig(**{field: value})


def test_derived_config_fills_the_defaults_and_reserves_the_tree_slots():
    model_config = LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                               max_position_embeddings=256)
    cpu = torch.device("cpu")

    def derive(spec: SpecConfig) -> EngineConfig:  # KV for one full sequence + 16 slots
        cache = CacheConfig(kv_cache_tokens=256 + 16, block_size=1)
        return worker.derive_config(EngineConfig(cache=cache, spec=spec), model_config, torch.float32, cpu)

    spec = derive(SpecConfig()).spec
    assert (spec.num_draft_tokens, spec.depth, spec.top_k, spec.lookup_tokens) == SPEC_DEFAULTS
    assert spec.max_batch is None and spec.lookup_max_batch is None
    # 8 + 8 slots fit; an explicit size survives, and 12 + 8 do not
    with pytest.raises(ValueError, match="cannot hold one full-length sequence"):
        derive(SpecConfig(num_draft_tokens=12))
    assert derive(SpecConfig(num_draft_tokens=12, lookup_tokens=0)).spec.num_draft_tokens == 12
    # without a draft head no slot is held: KV for exactly one full sequence is enough
    exact = CacheConfig(kv_cache_tokens=256, block_size=1)
    worker.derive_config(EngineConfig(cache=exact, spec=SpecConfig(draft=None)), model_config, torch.float32, cpu)
    with pytest.raises(ValueError, match="cannot hold one full-length sequence"):
        worker.derive_config(EngineConfig(cache=exact, spec=SpecConfig()), model_config, torch.float32, cpu)
