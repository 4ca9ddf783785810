"""Weight-only int4 linears for the target on the CPU (bfloat16 models; `--weight-quantization int4`).

Why: a decoding step with few rows is bound by reading the linears' weights from memory, and
4-bit weights are a quarter of bf16's bytes. The default model ships as a Q4_1 GGUF, whose
linears are already 4-bit: groups of 32 input weights, w = d * q + m with q in 0..15.

Quantization (the GGUF Q4_1 one): per output row, groups of
GROUP_SIZE consecutive input weights share a scale and a minimum; q = round((w - min) / scale)
in 0..15, scale = (max - min) / 15. Quantizing a Q4_1 file's dequantized weights this way gives
back the file's q exactly (each block holds its minimum at q = 0 and its maximum at q = 15);
scale and zero are then stored in bfloat16, as the kernels take them.

Each Int4Linear holds its weight twice, the same numbers in both: the 4-bit one for inputs of at
most `row_limit` rows and a dense bfloat16 one, (q - 8) * scale + zero rounded to bfloat16, for
more rows (oneDNN, compute-bound there). Two kernels read the 4-bit weight:
- on a CPU with AMX, the project's tile kernel (csrc/int4_linear.cpp): it dequantizes each
  32 x 16 block of the weight once into exactly the dense weight's bfloat16 values and multiplies
  up to TILE_ROWS rows with it on AMX, so its time hardly grows with the rows, and its results
  are the dense path's (bit for bit where oneDNN accumulates in the same order; they were on the
  Xeon it was written on);
- elsewhere, aten's weight-only kernel (`_weight_int4pack_mm_for_cpu`), whose time grows with the
  rows and whose sums round differently from the dense
  path's, so a token's logits then depend in their last bits on how many rows its step had;
  `--deterministic` refuses int4 weights.
Where the 4-bit weight stops paying depends on the CPU: `measure_row_limit` times both paths on
the model's own linears at start-up. The dispatch is a C++ operator so that a compiled graph
calls it without returning to Python.

Only the decoder's linears are converted: the LM head shares the embedding's weights (Q8_0 in
the default GGUF) and keeps them.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from eagle_core.worker.cpu_kernels import int4_linear_available
from eagle_core.worker.linear_children import linear_children
from eagle_core.worker.loader import cpu_has_amx_bf16

logger = logging.getLogger(__name__)

GROUP_SIZE = 32
"""Input weights per (scale, zero) pair: GGUF Q4_0/Q4_1 blocks."""

INT4_SOURCE_TYPE = "Q4_1"
"""The GGUF type whose dequantized weights `quantize_groups` gives back exactly."""

_PROBE_ROWS = (1, 2, 4, 8, 16, 32)
"""Row counts `measure_row_limit` tries, in increasing order."""

TILE_ROWS = 32
"""The most rows the tile kernel takes (two 16-row accumulator tiles)."""


def quantizable(linear: nn.Linear) -> bool:
    out_features, in_features = linear.weight.shape
    return (
        linear.bias is None
        and linear.weight.device.type == "cpu"
        and linear.weight.dtype == torch.bfloat16
        and in_features % GROUP_SIZE == 0
        and out_features % 16 == 0  # the kernel's packing works on blocks of 16 output rows
    )


def quantize_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (q [out, in] int32 in 0..15, scale [out, in / GROUP_SIZE] float32,
    minimum [out, in / GROUP_SIZE] float32), with weight ~= q * scale + minimum per group."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // GROUP_SIZE, GROUP_SIZE)
    low, high = groups.amin(-1), groups.amax(-1)  # [out, in / G]
    scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return q.to(torch.int32).reshape(out_features, in_features), scale, low


def tile_layout(
    q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The AMX tile kernel's layout (csrc/int4_linear.cpp, dequant_tile) of q [out, in] (0..15)
    and bfloat16 scale, zero [out, in / 32]: nibbles [out / 16, in / 32, 16, 16] uint8, scales and
    zeros [out / 16, in / 32, 16]. Tile (n, k), row r, value j is q[16n + j // 2, 32k + 2r + j % 2];
    byte b of a row holds value b (low nibble) and value b + 16 (high nibble)."""
    out_features, in_features = q.shape
    nb, kb = out_features // 16, in_features // GROUP_SIZE
    values = q.reshape(nb, 16, kb, 16, 2).permute(0, 2, 3, 1, 4).reshape(nb, kb, 16, 32)  # [nb, kb, r, j]
    nibbles = (values[..., :16] | (values[..., 16:] << 4)).to(torch.uint8).contiguous()

    def per_tile(t: torch.Tensor) -> torch.Tensor:  # [out, in / 32] -> [out / 16, in / 32, 16]
        return t.reshape(nb, 16, kb).permute(0, 2, 1).contiguous()

    return nibbles, per_tile(scale), per_tile(zero)


class Int4Linear(nn.Module):
    """A bias-free CPU bfloat16 nn.Linear's weight as int4 groups, plus the dense bfloat16 weight
    they dequantize to; inputs of at most `row_limit` rows read the int4 weight.

    `tiles` (the default on a CPU with AMX) stores the 4-bit weight for the project's tile
    kernel, which dequantizes each block once into the dense weight's own bfloat16 values and
    multiplies up to TILE_ROWS rows with it; otherwise for aten's weight-only kernel."""

    def __init__(
        self, linear: nn.Linear, pack_dense: bool = True, row_limit: int = 1, tiles: bool | None = None
    ) -> None:
        super().__init__()
        if not int4_linear_available():
            raise RuntimeError("the int4 linear operator is unavailable (see the log)")
        if not quantizable(linear):
            raise ValueError(
                f"Int4Linear needs a bias-free CPU bfloat16 linear with in_features divisible by "
                f"{GROUP_SIZE} and out_features by 16; got {linear.weight.device.type} "
                f"{linear.weight.dtype}, {tuple(linear.weight.shape)}, bias {linear.bias is not None}"
            )
        self.out_features, self.in_features = linear.weight.shape
        self.tiles = cpu_has_amx_bf16() if tiles is None else tiles
        q, scale, low = quantize_groups(linear.weight)
        scale = scale.to(torch.bfloat16)
        zero = (low + 8 * scale.float()).to(torch.bfloat16)  # the kernels compute (q - 8) * scale + zero
        groups = q.float().reshape(self.out_features, -1, GROUP_SIZE) - 8
        dense = (groups * scale.float()[..., None] + zero.float()[..., None]).reshape(q.shape)
        dense = dense.to(torch.bfloat16)  # [out, in]
        self.dense_packed = pack_dense
        if pack_dense:
            dense = torch.ops.mkldnn._reorder_linear_weight(dense, 1)
        if self.tiles:
            weight4, scales, zeros = tile_layout(q, scale, zero)
        else:
            weight4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            scales = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [in / G, out, 2]
            zeros = torch.empty(0, dtype=torch.bfloat16)
        self.register_buffer("weight4", weight4)
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", zeros)
        self.register_buffer("dense", dense)
        self.row_limit = min(row_limit, TILE_ROWS) if self.tiles else row_limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [*, in] bf16 -> [*, out] bf16
        out = self.run(x.reshape(-1, self.in_features).contiguous(), self.row_limit)  # [N, out]
        return out.view(*x.shape[:-1], self.out_features)

    def run(self, rows: torch.Tensor, row_limit: int) -> torch.Tensor:  # [N, in] -> [N, out]
        """The operator over contiguous `rows` with the int4 weight serving up to `row_limit` rows."""
        return torch.ops.eagle_serve.int4_linear(
            rows, self.weight4, self.scales, self.zeros, self.tiles, self.dense, self.dense_packed,
            GROUP_SIZE, row_limit,
        )

    def dense_weight(self) -> torch.Tensor:
        """[out, in] bfloat16: the weight both paths compute with."""
        if not self.dense_packed:
            return self.dense
        return self.run(torch.eye(self.in_features, dtype=torch.bfloat16), 0).T.contiguous()


def quantize_decoder(model: nn.Module, pack_dense: bool = True) -> tuple[list[str], list[str]]:
    """Replace every nn.Linear of `model`'s decoder (`get_decoder()`) by an Int4Linear, in place;
    returns the dotted names (replaced, left as they were: shapes the kernel cannot take)."""
    replaced, left = [], []
    for parent, child_name, full, linear in linear_children(model.get_decoder(), skip=Int4Linear):
        if quantizable(linear):
            setattr(parent, child_name, Int4Linear(linear, pack_dense))
            replaced.append(full)
        else:
            left.append(full)
    return replaced, left


def time_pass(linears: list[Int4Linear], inputs: dict[int, torch.Tensor], row_limit: int) -> float:
    """Seconds for one call of each of `linears` in turn on `inputs[in_features]` ([N, in]
    bfloat16), the int4 weight serving up to `row_limit` rows."""
    start = time.perf_counter()
    for m in linears:
        m.run(inputs[m.in_features], row_limit)
    return time.perf_counter() - start


def measure_row_limit(model: nn.Module, repeats: int = 7) -> int:
    """The most rows (of _PROBE_ROWS, 0 if none) up to which the int4 path beat the dense one on
    this CPU; sets every Int4Linear's row_limit to it. Each timing is one pass over all of
    `model`'s Int4Linears in turn (so the weights come from memory, as in a step); the two paths
    take turns, `repeats` passes each, and the fastest pass of each is compared, so that other
    work on the machine (another server starting) slows both alike."""
    linears = [m for m in model.modules() if isinstance(m, Int4Linear)]
    if not linears:
        return 0
    limit, timings = 0, []
    with torch.inference_mode():
        for rows in _PROBE_ROWS:
            inputs = {n: torch.randn(rows, n, dtype=torch.bfloat16) for n in {m.in_features for m in linears}}
            time_pass(linears, inputs, rows), time_pass(linears, inputs, 0)  # first touches
            int4 = dense = float("inf")
            for _ in range(repeats):
                int4 = min(int4, time_pass(linears, inputs, rows))
                dense = min(dense, time_pass(linears, inputs, 0))
            timings.append(f"{rows} rows {int4 * 1e3:.2f} / {dense * 1e3:.2f} ms")
            if int4 >= dense:
                break
            limit = rows
    logger.info("int4 / dense linears per pass: %s", ", ".join(timings))
    if limit == 0:
        logger.warning("int4 weights lost to the dense ones even at one row here: every step reads the dense weights")
    for m in linears:
        m.row_limit = limit
    return limit
