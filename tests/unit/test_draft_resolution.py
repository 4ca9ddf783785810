"""Which draft head an engine loads: explicit, none, or the shipped head of the default model."""

from __future__ import annotations

from eagle_core.config import AUTO_DRAFT, EngineConfig, ModelConfig, SpecConfig
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
