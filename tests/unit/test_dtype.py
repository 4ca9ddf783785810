"""Device and dtype resolution (no model)."""

from __future__ import annotations

import pytest
import torch

from eagle_core.errors import ModelLoadError
from eagle_core.worker import loader
from eagle_core.worker.loader import resolve_device, resolve_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("bf16", torch.bfloat16),
        ("float16", torch.float16),
        ("FP16", torch.float16),
    ],
)
def test_explicit_dtypes(name, dtype):
    assert resolve_dtype(name, CPU) == dtype


def test_unknown_dtype_names_the_choices():
    with pytest.raises(ModelLoadError) as info:
        resolve_dtype("float8", CPU)
    for choice in ("auto", "float32", "bfloat16", "float16"):
        assert choice in str(info.value)
    assert "'float8'" in str(info.value)


@pytest.mark.parametrize("native_bf16, expected", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_dtype_on_cpu_follows_native_bf16(monkeypatch, native_bf16, expected):
    monkeypatch.setattr(loader, "cpu_has_native_bf16", lambda: native_bf16)
    assert resolve_dtype("auto", CPU) == expected


def test_cpu_bf16_detection_reads_cpu_flags():
    try:
        cpuinfo = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    flagged = any(flag in cpuinfo.split() for flag in ("avx512_bf16", "amx_bf16", "bf16"))
    assert loader.cpu_has_native_bf16() == flagged
    assert loader.cpu_has_amx_bf16() == ("amx_bf16" in cpuinfo.split())


def test_auto_device():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_without_cuda_is_a_load_error():
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        resolve_device("cuda")


def test_bogus_device_is_a_load_error():
    with pytest.raises(ModelLoadError, match="unknown device 'gpu7'"):
        resolve_device("gpu7")


@pytest.mark.parametrize(
    "native_bf16, dtype, device, warns",
    [
        (False, torch.bfloat16, CPU, True),
        (True, torch.bfloat16, CPU, False),
        (False, torch.float32, CPU, False),
        (False, torch.bfloat16, torch.device("cuda"), False),
    ],
)
def test_bf16_on_a_cpu_without_it_warns(monkeypatch, caplog, native_bf16, dtype, device, warns):
    monkeypatch.setattr(loader, "cpu_has_native_bf16", lambda: native_bf16)
    with caplog.at_level("WARNING", logger=loader.logger.name):
        loader._warn_on_emulated_bf16(dtype, device)
    assert ("without native bf16" in caplog.text) == warns
