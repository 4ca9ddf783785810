"""Weight-only int8 linears for the draft head on the CPU (bfloat16 models).

Why: at batch 1 on a CPU a draft forward is bound by reading the head's weights (~20 MB in
bf16 for the default head), and the target's forward between two draft steps pushes them out
of cache, so every step reads them from memory again. Stored as int8 with one scale per output
row they take half the bytes, and torch's fused weight-only kernel (`_weight_int8pack_mm`, the
one gpt-fast and torchchat use on CPUs) runs the head's decoding shapes faster than the bf16
linear (`python -m bench.tree_sizes --draft-quantization int8 none` measures the engine-level
effect; docs/benchmarks.md, "What the speculation defaults rest on", has the kernel timings).
Hand-written because the module is one kernel call, and torchao's weight-only int8 path
converts the weights back to the activation dtype on every CPU call.

Where the kernel loses, the original linear runs instead:
- many rows (a prompt's catch-up): the kernel is compute-bound there, so inputs of more than
  ROW_LIMIT rows take the bf16 weights, which are kept (for the default head, 20 MB beside the
  10 MB of int8 ones);
- float32 and float16: torch 2.13 has no vectorised x86 kernel for them, so only bfloat16
  linears are converted.

Rounding the head's weights can only change which tokens are proposed: the target still
verifies every one, so the output distribution is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from eagle_core.worker.linear_children import linear_children

# torch 2.13's bf16 CPU kernel crashes the process (segfault) when in_features is not a multiple
# of 32; such linears stay unquantized.
_KERNEL_BLOCK = 32

ROW_LIMIT = 16
"""Rows up to which the int8 kernel runs by default: with weights out of cache, as in the engine,
int8 still won at 16 rows and loses beyond (docs/benchmarks.md, "What the
speculation defaults rest on")."""


def quantizable(linear: nn.Linear) -> bool:
    return (
        linear.weight.device.type == "cpu"
        and linear.weight.dtype == torch.bfloat16
        and linear.in_features % _KERNEL_BLOCK == 0
    )


def wants_int8(mode: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a draft head on `device` in `dtype` gets int8 weights (SpecConfig.draft_quantization)."""
    if mode == "auto":
        return device.type == "cpu" and dtype == torch.bfloat16
    return mode == "int8"


class Int8Linear(nn.Module):
    """A bf16 nn.Linear plus int8 weights (symmetric, one bf16 scale per output row) that serve
    inputs of at most `row_limit` rows."""

    def __init__(self, linear: nn.Linear, row_limit: int = ROW_LIMIT) -> None:
        super().__init__()
        if not quantizable(linear):
            raise ValueError(
                f"Int8Linear needs a CPU bfloat16 linear with in_features divisible by "
                f"{_KERNEL_BLOCK}; got {linear.weight.device.type} {linear.weight.dtype}, "
                f"in_features {linear.in_features}"
            )
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.linear = linear
        self.row_limit = row_limit
        weight = linear.weight.detach().float()  # [out, in]
        # Round the scale to bf16 first: the kernel multiplies by the bf16 scale.
        scale = (weight.abs().amax(dim=1).clamp_min(1e-12) / 127).to(linear.weight.dtype)  # [out]
        int8 = torch.round(weight / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", int8)
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [*, in] -> [*, out]
        rows = x.reshape(-1, self.in_features)  # [N, in]
        if rows.shape[0] > self.row_limit:
            return self.linear(x)
        rows = rows.to(self.scale.dtype).contiguous()
        out = torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scale)  # [N, out]
        out = out.view(*x.shape[:-1], self.out_features)
        return out if self.linear.bias is None else out + self.linear.bias


def quantize_linears(
    module: nn.Module, keep: tuple[str, ...] = (), row_limit: int = ROW_LIMIT
) -> tuple[list[str], list[str]]:
    """Replace every quantizable nn.Linear under `module` (in place) except those whose own name
    is in `keep`; returns the dotted names (replaced, left as they were)."""
    replaced, left = [], []
    for parent, child_name, full, linear in linear_children(module, skip=Int8Linear):
        if child_name in keep:
            continue
        if quantizable(linear):
            setattr(parent, child_name, Int8Linear(linear, row_limit))
            replaced.append(full)
        else:
            left.append(full)
    return replaced, left
