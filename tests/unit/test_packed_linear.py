"""bf16 linears on oneDNN-packed weights (the target's and the draft head's CPU linears on AMX)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from eagle_core.config import ModelConfig
from eagle_core.spec.int8_linear import Int8Linear
from eagle_core.worker.loader import cpu_has_amx_bf16
from eagle_core.worker.packed_linear import ROW_LIMIT, PackedLinear, pack_linears, wants_packing

CPU = torch.device("cpu")
needs_amx = pytest.mark.skipif(
    not (cpu_has_amx_bf16() and torch.backends.mkldnn.is_available()),
    reason="weight packing runs only on x86 CPUs with AMX bf16 (--weight-packing auto)",
)


def _linear(in_features: int, out_features: int, bias: bool = False) -> nn.Linear:
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.mul_(2.0)  # weights of a trained model's scale, not init's tiny ones
    return linear.to(torch.bfloat16)


# SmolLM2-135M's and its EAGLE-3 head's linear shapes (in, out), the tied LM head and the head's
# q/k/v over concat(embedding, hidden) among them: blocking depends on the shape.
SMOLLM2_SHAPES = [
    (576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152),
    (1152, 576), (1152, 192), (576, 8192), (1728, 576),
]


@needs_amx
@pytest.mark.parametrize(("in_features", "out_features"), SMOLLM2_SHAPES)
def test_up_to_the_row_limit_the_packed_kernel_equals_torchs_linear_bit_for_bit(in_features, out_features):
    """What the engine relies on: packing changes no number it computes, so the same text comes
    out with and without packing (and rows past the limit, on torch's linear, agree with it)."""
    linear = _linear(in_features, out_features)
    packed = PackedLinear(linear)
    torch.manual_seed(1)
    x = torch.randn(ROW_LIMIT, in_features).to(torch.bfloat16)  # [32, in]
    for rows in (1, 2, 3, 8, 11, 16, 24, ROW_LIMIT):
        with torch.inference_mode():
            assert torch.equal(packed(x[:rows]), linear(x[:rows])), f"{rows} rows"
    assert packed.matches_linear()  # the check each start runs agrees


@needs_amx
def test_a_rows_result_does_not_depend_on_the_other_rows():
    linear = _linear(576, 1536)
    packed = PackedLinear(linear)
    torch.manual_seed(2)
    x = torch.randn(1, ROW_LIMIT, 576).to(torch.bfloat16)  # [B, T, in]: leading dims are kept
    with torch.inference_mode():
        together = packed(x)
        assert together.shape == (1, ROW_LIMIT, 1536)
        for row in (0, 7, ROW_LIMIT - 1):
            assert torch.equal(packed(x[:, row : row + 1]), together[:, row : row + 1])


@needs_amx
@pytest.mark.parametrize("bias", [True, False])
def test_inputs_up_to_the_limit_run_on_the_packed_copy_and_larger_ones_on_the_linear(bias):
    linear = _linear(64, 32, bias)
    packed = PackedLinear(linear)
    torch.manual_seed(3)
    x = torch.randn(ROW_LIMIT + 1, 64).to(torch.bfloat16)
    with torch.inference_mode():
        before = linear(x)
        linear.weight.zero_()  # the packed copy keeps the old weights
        assert torch.equal(packed(x[:ROW_LIMIT]), before[:ROW_LIMIT])
        assert torch.equal(packed(x), linear(x))  # 33 rows: the (now zeroed) linear
        assert not torch.equal(packed(x), before)
        assert packed(x[:0]).shape == (0, 32)  # no rows: the linear, not the packed kernel


@needs_amx
def test_pack_linears_wraps_bf16_cpu_linears_inside_int8_ones_and_keeps_tied_weights():
    torch.manual_seed(4)
    embed = nn.Embedding(100, 64).to(torch.bfloat16)
    model = nn.ModuleDict({
        "proj": nn.Linear(64, 64, bias=False).to(torch.bfloat16),
        "fp32": nn.Linear(64, 64),
        "quantized": Int8Linear(nn.Linear(64, 64).to(torch.bfloat16), row_limit=4),
        "head": nn.Linear(64, 100, bias=False).to(torch.bfloat16),
    })
    model["head"].weight = embed.weight  # tied, as SmolLM2's LM head is
    assert sorted(pack_linears(model)) == ["head", "proj", "quantized.linear"]
    assert type(model["fp32"]) is nn.Linear
    assert isinstance(model["quantized"].linear, PackedLinear)
    assert model["head"].weight is embed.weight  # code reading lm_head.weight still sees it
    assert pack_linears(model) == []  # packing twice wraps nothing again
    x = torch.randn(8, 64).to(torch.bfloat16)
    with torch.inference_mode():
        # 8 rows: past the int8 limit of 4, so the packed bf16 fallback runs
        assert torch.equal(model["quantized"](x), model["quantized"].linear.linear(x))


@needs_amx
def test_a_kernel_that_differs_from_torchs_packs_nothing(monkeypatch):
    model = nn.Sequential(nn.Linear(64, 64).to(torch.bfloat16), nn.Linear(64, 32).to(torch.bfloat16))
    shapes = []

    def differs_for_the_second_shape(self):
        shapes.append(self.out_features)
        return self.out_features == 64

    monkeypatch.setattr(PackedLinear, "matches_linear", differs_for_the_second_shape)
    assert pack_linears(model) == []
    assert shapes == [64, 32]  # one check per shape
    assert [type(m) for m in model] == [nn.Linear, nn.Linear]  # nothing wrapped, not even the first


def test_packing_needs_a_bf16_cpu_linear():
    with pytest.raises(ValueError, match="needs a CPU bfloat16 linear"):
        PackedLinear(nn.Linear(8, 8))


@pytest.mark.parametrize(
    ("mode", "device", "dtype", "amx", "expected"),
    [
        ("auto", CPU, torch.bfloat16, True, torch.backends.mkldnn.is_available()),
        ("auto", CPU, torch.bfloat16, False, False),  # AVX512-BF16 without AMX: not measured
        ("auto", CPU, torch.float32, True, False),
        ("auto", torch.device("cuda"), torch.bfloat16, True, False),
        ("none", CPU, torch.bfloat16, True, False),
    ],
)
def test_which_models_get_packed_weights(mode, device, dtype, amx, expected):
    assert wants_packing(mode, device, dtype, amx) is expected


def test_unknown_weight_packing_is_refused():
    with pytest.raises(ValueError, match="weight_packing must be one of auto, none"):
        ModelConfig(weight_packing="mkl")
