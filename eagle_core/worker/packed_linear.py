"""bf16 linears with oneDNN-packed weights, for decoding-sized inputs on CPUs with AMX.

Why: on a CPU with AMX, torch's bf16 linear over a plain weight costs much more than the same
matmul on a weight packed once into oneDNN's blocked layout (`torch.ops.mkldnn.
_reorder_linear_weight`, then `torch.ops.mkldnn._linear_pointwise`: the pair torch's inductor
emits for a frozen CPU linear; docs/benchmarks.md, "A CPU with AMX", has the timings). Compiled
forwards (`--compile on`, the CPU default) get the same packing from inductor's freezing; this
module serves eager forwards (`--compile off`), where no library route fits:
intel-extension-for-pytorch has no release for torch 2.13.

Inputs of at most ROW_LIMIT rows take the packed weight; larger ones (prefill chunks, big batches)
the original linear, which is kept, so the linears' weights are held twice. Up to 32 rows the
packed kernel's results are bit-identical to torch's linear, and batch-invariant (a row's
result does not depend on the other rows); from 33 rows torch's linear switches kernels and the
two differ in the last bits. So the limit keeps every number the engine computes what it was
without packing: the same text with and without packing, alone or in a batch, with or without
speculation (tests/unit/test_packed_linear.py checks it).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from eagle_core.worker.linear_children import LinearWrapper, linear_children

logger = logging.getLogger(__name__)

ROW_LIMIT = 32
"""Rows up to which the packed weight runs (see the module docstring for why 32)."""


def wants_packing(mode: str, device: torch.device, dtype: torch.dtype, amx_bf16: bool) -> bool:
    """Whether a model on `device` in `dtype` gets packed linears (ModelConfig.weight_packing):
    bf16 on an x86 CPU with AMX (docs/benchmarks.md, "A CPU with AMX"), where torch was built
    with oneDNN."""
    return (
        mode == "auto"
        and device.type == "cpu"
        and dtype == torch.bfloat16
        and amx_bf16
        and torch.backends.mkldnn.is_available()
    )


class PackedLinear(LinearWrapper):
    """A bf16 CPU nn.Linear plus its weight packed for oneDNN, which serves inputs of at most
    ROW_LIMIT rows."""

    def __init__(self, linear: nn.Linear) -> None:
        if linear.weight.device.type != "cpu" or linear.weight.dtype != torch.bfloat16:
            raise ValueError(
                f"PackedLinear needs a CPU bfloat16 linear; got {linear.weight.device.type} "
                f"{linear.weight.dtype}"
            )
        super().__init__(linear)
        # The batch-size hint picks oneDNN's blocking: 1 was fastest up to 64 rows.
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.register_buffer("packed_weight", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [*, in] -> [*, out]
        rows = x.numel() // self.in_features
        if not 0 < rows <= ROW_LIMIT or x.dtype != torch.bfloat16:
            return self.linear(x)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.linear.bias, "none", [], "")

    def matches_linear(self) -> bool:
        """Whether the packed kernel gives torch's linear's results bit for bit here, and the
        same for one row alone as inside a full batch (checked on random inputs: the property
        was measured on one CPU and one oneDNN version, so each start checks it again)."""
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(ROW_LIMIT, self.in_features, generator=generator).to(torch.bfloat16)  # [32, in]
        with torch.inference_mode():
            together = self(x)  # [32, out]
            for rows in (1, 7, ROW_LIMIT):
                packed = together if rows == ROW_LIMIT else self(x[:rows])  # [rows, out]
                if not (torch.equal(packed, self.linear(x[:rows])) and torch.equal(packed, together[:rows])):
                    return False
            return True


def pack_linears(module: nn.Module) -> list[str]:
    """Wrap every CPU bf16 nn.Linear under `module` (in place, including those inside an
    Int8Linear) in a PackedLinear; returns their dotted names. Wraps nothing (and returns []) if
    for any of their shapes the packed kernel's results differ from torch's linear."""
    wrapped = [
        (parent, child_name, full, PackedLinear(linear))
        for parent, child_name, full, linear in linear_children(module, skip=PackedLinear)
        if type(linear) is nn.Linear and linear.weight.device.type == "cpu" and linear.weight.dtype == torch.bfloat16
    ]
    checked: dict[tuple[int, int, bool], bool] = {}
    for _, _, full, packed in wrapped:
        shape = (packed.in_features, packed.out_features, packed.bias is not None)
        if shape not in checked:
            checked[shape] = packed.matches_linear()
        if not checked[shape]:
            logger.warning(
                "weight packing off: oneDNN's packed kernel differs from torch's linear on this CPU "
                "(%s, %d -> %d); --weight-packing none silences this", full, *shape[:2]
            )
            return []
    for parent, child_name, _, packed in wrapped:
        setattr(parent, child_name, packed)
    return [full for _, _, full, _ in wrapped]
