"""Weight-only int8 linears for the draft head on the CPU.

Why: at batch 1 on a CPU a draft forward is bound by reading the head's weights (~20 MB in
bf16 for the default head), and the target's forward between two draft steps pushes them out
of cache, so every step reads them from memory again. Stored as int8 with one scale per output
row they take half the bytes, and torch's fused weight-only kernel (`_weight_int8pack_mm`, the
one gpt-fast and torchchat use on CPUs) runs the head's shapes 2-3x faster than the bf16
linear, cold or warm (`python -m bench.tree_sizes --draft-quantization int8 none` measures the
engine-level effect). Hand-written because the module is one kernel call, and torchao's
weight-only int8 path converts the weights back to the activation dtype on every CPU call.

Rounding the head's weights can only change which tokens are proposed: the target still
verifies every one, so the output distribution is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

# torch 2.13's bf16 CPU kernel crashes the process (segfault) when in_features is not a multiple
# of 32; such linears stay unquantized.
_KERNEL_BLOCK = 32


class Int8Linear(nn.Module):
    """nn.Linear with int8 weights, symmetric per output row, and the activation dtype's scales."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()  # [out, in]
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127  # [out]
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [*, in] -> [*, out]
        rows = x.reshape(-1, self.in_features).to(self.scale.dtype)  # [N, in]
        out = torch.ops.aten._weight_int8pack_mm(rows, self.weight_int8, self.scale)  # [N, out]
        out = out.view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def quantizable(linear: nn.Linear) -> bool:
    return (
        linear.weight.device.type == "cpu"
        and linear.in_features % _KERNEL_BLOCK == 0
        and linear.weight.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


def quantize_linears(module: nn.Module, keep: tuple[str, ...] = ()) -> list[str]:
    """Replace every quantizable nn.Linear under `module` (in place) except those whose own name
    is in `keep`; returns the dotted names replaced."""
    replaced = []
    for name, child in list(module.named_modules()):
        for child_name, grandchild in list(child.named_children()):
            if isinstance(grandchild, nn.Linear) and child_name not in keep and quantizable(grandchild):
                setattr(child, child_name, Int8Linear(grandchild))
                replaced.append(f"{name}.{child_name}" if name else child_name)
    return replaced
