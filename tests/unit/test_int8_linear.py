"""Weight-only int8 linears (the draft head's CPU weights)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagle_core.spec.int8_linear import Int8Linear, quantize_linears


def _linear(in_features: int, out_features: int, dtype: torch.dtype, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_linear_it_replaces(dtype):
    linear = _linear(96, 40, dtype)
    quantized = Int8Linear(linear)
    x = torch.randn(2, 5, 96).to(dtype)  # [B, T, in]: leading dims are kept
    # What the kernel must compute: x @ (int8 weight * row scale).T + bias.
    dequantized = quantized.weight_int8.float() * quantized.scale.float()[:, None]
    expected = x.float() @ dequantized.T + linear.bias.float()
    got = quantized(x)
    assert got.shape == (2, 5, 40) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)
    # Rounding to 8 bits per row stays well under 1% of the output.
    reference = linear(x).float()
    assert ((got.float() - reference).norm() / reference.norm()).item() < 0.01
    assert quantized.weight_int8.dtype == torch.int8
    assert quantized.weight_int8.abs().max().item() == 127  # each row's largest weight maps to 127


def test_zero_rows_give_the_bias_not_nan():
    linear = _linear(64, 8, torch.float32)
    with torch.no_grad():
        linear.weight[3].zero_()
    out = Int8Linear(linear)(torch.randn(4, 64))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 3], linear.bias[3].expand(4))


def test_quantize_linears_keeps_named_and_unsupported_shapes():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.mlp = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 64))
            self.odd = nn.Linear(48, 16)  # the CPU kernel needs in_features % 32 == 0

    block = Block()
    replaced = quantize_linears(block, keep=("fc",))
    assert replaced == ["mlp.0", "mlp.2"]
    assert isinstance(block.mlp[0], Int8Linear) and isinstance(block.mlp[2], Int8Linear)
    assert type(block.fc) is nn.Linear and type(block.odd) is nn.Linear
