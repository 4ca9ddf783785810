"""Int4 weights for the target's decoder linears (--weight-quantization int4)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from eagle_core.config import ModelConfig
from eagle_core.worker.cpu_kernels import int4_linear_available
from eagle_core.worker.int4_linear import (
    GROUP_SIZE,
    Int4Linear,
    measure_row_limit,
    quantize_decoder,
    quantize_groups,
    tile_layout,
)
from eagle_core.worker.loader import cpu_has_amx_bf16

needs_kernel = pytest.mark.skipif(not int4_linear_available(), reason="the int4 linear operator could not be built here")


def _linear(in_features: int, out_features: int, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=False)
    with torch.no_grad():
        linear.weight.mul_(2.0)
    return linear.to(torch.bfloat16)


def test_a_q4_1_files_blocks_come_back_exactly():
    """Quantizing Q4_1 blocks dequantized the way gguf does (fp32 d * q + m, fp16 d and m) gives
    back the file's q, d and m: int4 weights of the default model are its own weights."""
    generator = torch.Generator().manual_seed(0)
    out_features, in_features = 48, 4 * GROUP_SIZE
    q = torch.randint(0, 16, (out_features, in_features // GROUP_SIZE, GROUP_SIZE), generator=generator)
    q[..., 0], q[..., 1] = 0, 15  # llama.cpp maps each block's minimum to 0 and its maximum to 15
    d = (torch.rand(out_features, in_features // GROUP_SIZE, generator=generator) * 0.01 + 1e-4).half().float()
    m = (-torch.rand(out_features, in_features // GROUP_SIZE, generator=generator) * 0.1).half().float()
    weight = (d[..., None] * q.float() + m[..., None]).reshape(out_features, in_features)

    got_q, scale, low = quantize_groups(weight)

    assert torch.equal(got_q, q.reshape(out_features, in_features).to(torch.int32))
    assert torch.equal(low, m)
    torch.testing.assert_close(scale, d, rtol=1e-6, atol=0)


def test_quantized_weights_are_within_half_a_step_of_the_originals():
    weight = _linear(128, 32).weight.float()
    q, scale, low = quantize_groups(weight)
    groups = q.float().reshape(32, -1, GROUP_SIZE) * scale[..., None] + low[..., None]
    error = (groups.reshape(32, 128) - weight).abs().reshape(32, -1, GROUP_SIZE)
    assert (error <= scale[..., None] / 2 * (1 + 1e-5)).all()
    assert q.min() == 0 and q.max() == 15


needs_amx = pytest.mark.skipif(not cpu_has_amx_bf16(), reason="the tile kernel needs a CPU with AMX")
LAYOUTS = [False, pytest.param(True, marks=needs_amx)]
"""Int4Linear.tiles: aten's kernel, the project's AMX tile kernel."""


@needs_kernel
@pytest.mark.parametrize("tiles", LAYOUTS)
@pytest.mark.parametrize("pack_dense", [True, False])
def test_the_row_limit_picks_the_int4_weight_up_to_it_and_the_dense_one_beyond(pack_dense, tiles):
    """The operator's contract, seen through a dense weight that disagrees with the int4 one
    (zeros): rows <= row_limit read the int4 weight, more rows the dense one."""
    if pack_dense and not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not in this torch build")
    linear = Int4Linear(_linear(64, 32), pack_dense=pack_dense, tiles=tiles)
    zeros = torch.zeros(32, 64, dtype=torch.bfloat16)
    linear.dense = torch.ops.mkldnn._reorder_linear_weight(zeros, 1) if pack_dense else zeros
    x = torch.randn(33, 64).to(torch.bfloat16)
    for rows, limit, int4 in ((1, 1, True), (4, 4, True), (5, 4, False), (2, 0, False), (32, 32, True), (33, 32, False)):
        out = linear.run(x[:rows].contiguous(), limit)
        assert out.shape == (rows, 32)
        assert (out.abs().sum() > 0) == int4, (rows, limit)


@needs_kernel
@pytest.mark.parametrize("tiles", LAYOUTS)
@pytest.mark.parametrize("pack_dense", [True, False])
def test_both_paths_compute_with_the_same_weights(pack_dense, tiles):
    """The int4 kernel and the dense weight compute x @ W.T for one W: the quantized weight."""
    if pack_dense and not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN is not in this torch build")
    original = _linear(576, 192)
    linear = Int4Linear(original, pack_dense=pack_dense, row_limit=32, tiles=tiles)
    q, scale, low = quantize_groups(original.weight)
    scale16 = scale.to(torch.bfloat16).float()
    zero16 = (low + 8 * scale16).to(torch.bfloat16).float()
    expected_weight = ((q.float().reshape(192, -1, GROUP_SIZE) - 8) * scale16[..., None] + zero16[..., None])
    assert torch.equal(linear.dense_weight(), expected_weight.reshape(192, 576).to(torch.bfloat16))

    x = torch.randn(40, 576).to(torch.bfloat16)
    reference = x.float() @ expected_weight.reshape(192, 576).T  # [40, 192]
    with torch.inference_mode():
        dense_out = linear.run(x, 0)
        for rows in (1, 3, 16, 17, 32):
            int4_out = linear.run(x[:rows].contiguous(), 32)
            torch.testing.assert_close(int4_out.float(), reference[:rows], rtol=2e-2, atol=2e-2)
            if tiles:  # the same bf16 weight, each row's sum over the same products
                torch.testing.assert_close(int4_out.float(), dense_out[:rows].float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(dense_out.float(), reference, rtol=2e-2, atol=2e-2)


def test_the_tile_layout_places_each_weight_where_the_kernel_reads_it():
    """Tile (n, k), row r, value j is q[16n + j // 2, 32k + 2r + j % 2]; byte b holds values b
    and b + 16 (csrc/int4_linear.cpp, dequant_tile)."""
    q = torch.randint(0, 16, (32, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    scale = torch.arange(32 * 2, dtype=torch.float32).reshape(32, 2).to(torch.bfloat16)
    nibbles, scales, zeros = tile_layout(q, scale, -scale)
    assert nibbles.shape == (2, 2, 16, 16) and scales.shape == zeros.shape == (2, 2, 16)
    for n, k, r, j in ((0, 0, 0, 0), (1, 1, 15, 31), (0, 1, 7, 17), (1, 0, 3, 2)):
        byte = int(nibbles[n, k, r, j % 16])
        value = byte >> 4 if j >= 16 else byte & 0xF
        assert value == q[16 * n + j // 2, 32 * k + 2 * r + j % 2]
    assert scales[1, 0, 5] == scale[21, 0] and zeros[0, 1, 3] == -scale[3, 1]


@needs_kernel
def test_a_compiled_graph_calls_the_operator_and_agrees_with_eager():
    linear = Int4Linear(_linear(64, 32), row_limit=2)
    compiled = torch.compile(linear, fullgraph=True, dynamic=True)
    with torch.inference_mode():
        for rows in (2, 5):
            x = torch.randn(rows, 64).to(torch.bfloat16)
            assert torch.equal(compiled(x), linear(x))


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


@needs_kernel
def test_the_decoders_linears_are_converted_and_the_lm_head_is_not():
    model = _tiny_llama()
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.inference_mode():
        before = model(ids).logits.float()
    replaced, left = quantize_decoder(model)
    assert len(replaced) == 2 * 7 and left == []
    assert type(model.lm_head) is nn.Linear
    assert isinstance(model.model.layers[0].self_attn.q_proj, Int4Linear)
    assert isinstance(model.model.layers[1].mlp.down_proj, Int4Linear)
    limit = measure_row_limit(model, repeats=1)
    assert limit in (0, 1, 2, 4, 8, 16, 32)
    assert {m.row_limit for m in model.modules() if isinstance(m, Int4Linear)} == {limit}
    with torch.inference_mode():
        after = model(ids).logits.float()
    # 4-bit weights move the logits, not the model: the next-token choice at most positions
    assert (after.argmax(-1) == before.argmax(-1)).float().mean() >= 0.6


def test_the_config_refuses_unknown_modes_and_deterministic_int4():
    with pytest.raises(ValueError, match="weight_quantization must be one of"):
        ModelConfig(weight_quantization="int3")
    with pytest.raises(ValueError, match="deterministic mode"):
        ModelConfig(weight_quantization="int4", deterministic=True)
    assert ModelConfig(weight_quantization="auto", deterministic=True).deterministic  # auto then means none
    assert ModelConfig().weight_quantization == "auto"
