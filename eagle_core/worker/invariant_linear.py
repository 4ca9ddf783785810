"""Batch-invariant linears for `--deterministic`: every input row is computed in a block of
exactly BLOCK_ROWS rows.

Why: a GEMM library picks its blocking (and, for wide weights, its split of the work between
threads) by the number of rows, so one row's result can change in the last bits with the rows
beside it: with torch 2.13's oneDNN/MKL kernels, one row alone against the same row among
2, 4 or 16 others differed for bf16 weights of 4096 x 576 and wider (the LM head) and for every
fp32 weight tried. In bf16 such a difference is a whole unit of the last place of a logit, enough
to move a seeded draw. With a fixed row count the blocking is fixed, and there a row gave the
same bits at every position among the block's rows (bf16 and fp32, every shape tried). So a
linear computed block by block, the last block padded with zero rows, gives each row a result
that depends on that row alone.

That property was measured, not promised by the libraries: `BlockLinear.is_invariant` checks it
for each weight shape when the model is wrapped, and `wrap_linears` refuses to start otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from eagle_core.worker.linear_children import LinearWrapper, linear_children

BLOCK_ROWS = 8
"""Rows of every GEMM a BlockLinear runs. Fewer pay less at batch 1 (a decode step computes 8
rows for 1) and more per prefill token (more GEMM calls); docs/benchmarks.md, "Deterministic
mode", has the cost."""


class BlockLinear(LinearWrapper):
    """An nn.Linear run on blocks of exactly BLOCK_ROWS input rows (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [*, in] -> [*, out]
        rows = x.reshape(-1, self.in_features)  # [M, in]
        num_rows = rows.shape[0]
        padded = -(-num_rows // BLOCK_ROWS) * BLOCK_ROWS
        if padded != num_rows:
            rows = torch.cat([rows, rows.new_zeros(padded - num_rows, self.in_features)])  # [M', in]
        out = torch.cat(
            [F.linear(rows[start : start + BLOCK_ROWS], self.linear.weight, self.linear.bias)
             for start in range(0, padded, BLOCK_ROWS)]
        )  # [M', out]
        return out[:num_rows].reshape(*x.shape[:-1], self.out_features)

    def is_invariant(self) -> bool:
        """Whether, on this machine, a row's result is the same at every position of a block
        and equal to what the row gets alone in its block (checked on random inputs)."""
        generator = torch.Generator().manual_seed(0)
        weight = self.linear.weight
        x = torch.randn(BLOCK_ROWS + 1, self.in_features, generator=generator).to(weight.dtype)  # [R + 1, in]
        with torch.inference_mode():
            alone = self(x[:1])[0]  # [out]
            for position in range(BLOCK_ROWS):
                block = x[1:].clone()  # [R, in]
                block[position] = x[0]
                if not torch.equal(self(block)[position], alone):
                    return False
        return True


def wrap_linears(module: nn.Module) -> list[str]:
    """Wrap every nn.Linear under `module` in a BlockLinear (in place); returns their dotted
    names. Raises RuntimeError where a weight shape is not batch-invariant in blocks here."""
    wrapped = [
        (parent, name, full, BlockLinear(linear))
        for parent, name, full, linear in linear_children(module, skip=BlockLinear)
        if type(linear) is nn.Linear
    ]
    checked: set[tuple[int, int, bool]] = set()
    for _, _, full, block in wrapped:
        shape = (block.in_features, block.out_features, block.bias is not None)
        if shape not in checked:
            if not block.is_invariant():
                raise RuntimeError(
                    f"deterministic mode: {full} ({shape[0]} -> {shape[1]}) gives a row different "
                    f"results at different positions of a {BLOCK_ROWS}-row block on this machine"
                )
            checked.add(shape)
    for parent, name, _, block in wrapped:
        setattr(parent, name, block)
    return [full for _, _, full, _ in wrapped]
