"""Weight-only int8 linears (the draft head's CPU weights)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagle_core.spec.int8_linear import (
    ROW_LIMIT,
    Int8Linear,
    quantizable,
    quantize_linears,
    wants_int8,
)


def _linear(in_features: int, out_features: int, bias: bool = True, dtype=torch.bfloat16) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias).to(dtype)


@pytest.mark.parametrize("bias", [True, False])
def test_matches_the_linear_it_replaces(bias):
    linear = _linear(96, 40, bias)
    quantized = Int8Linear(linear)
    x = torch.randn(2, 5, 96, dtype=torch.bfloat16)  # [B, T, in]: leading dims are kept
    # What the kernel must compute: x @ (int8 weight * row scale).T (+ bias).
    dequantized = quantized.weight_int8.float() * quantized.scale.float()[:, None]
    expected = x.float() @ dequantized.T + (linear.bias.float() if bias else 0)
    got = quantized(x)
    assert got.shape == (2, 5, 40) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)
    # Rounding to 8 bits per row stays well under 1% of the output.
    reference = linear(x).float()
    assert ((got.float() - reference).norm() / reference.norm()).item() < 0.01
    assert quantized.weight_int8.dtype == torch.int8
    # every row's largest weight maps to +-127: the scale is per row
    assert (quantized.weight_int8.abs().amax(dim=1) == 127).all()


def test_many_rows_take_the_original_weights():
    linear = _linear(64, 32)
    quantized = Int8Linear(linear)
    many = torch.randn(ROW_LIMIT + 1, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(quantized(many), linear(many), atol=0, rtol=0)
    few = many[:ROW_LIMIT]
    assert not torch.equal(quantized(few), linear(few))  # the int8 path rounds differently


def test_zero_rows_give_the_bias_not_nan():
    linear = _linear(64, 8)
    with torch.no_grad():
        linear.weight[3].zero_()
    out = Int8Linear(linear)(torch.randn(4, 64, dtype=torch.bfloat16))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 3], linear.bias[3].expand(4))


@pytest.mark.parametrize(
    ("linear", "why"),
    [
        (nn.Linear(48, 16).to(torch.bfloat16), "in_features 48"),  # the kernel crashes off multiples of 32
        (nn.Linear(64, 16), "float32"),  # torch's x86 kernel is scalar for float32: slower than bf16
    ],
)
def test_unsupported_linears_are_refused(linear, why):
    assert not quantizable(linear)
    with pytest.raises(ValueError, match=why):
        Int8Linear(linear)


def test_quantize_linears_keeps_named_and_unsupported_shapes():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.mlp = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 64))
            self.odd = nn.Linear(48, 16)

    block = Block().to(torch.bfloat16)
    replaced, left = quantize_linears(block, keep=("fc",))
    assert (replaced, left) == (["mlp.0", "mlp.2"], ["odd"])
    assert isinstance(block.mlp[0], Int8Linear) and isinstance(block.mlp[2], Int8Linear)
    assert type(block.fc) is nn.Linear and type(block.odd) is nn.Linear
    assert quantize_linears(block, keep=("fc",)) == ([], ["odd"])  # a second pass changes nothing


def test_auto_means_bf16_on_the_cpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert wants_int8("auto", cpu, torch.bfloat16)
    assert not wants_int8("auto", cpu, torch.float32)
    assert not wants_int8("auto", cuda, torch.bfloat16)
    assert not wants_int8("none", cpu, torch.bfloat16)
    assert wants_int8("int8", cuda, torch.float32)  # asked for: the worker refuses it clearly
