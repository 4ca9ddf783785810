"""The target's LM head on a CPU in fp32 pads 7-15 rows to 16 (a faster MKL path): same logits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from eagle_core.worker.model_runner import TargetModel


def target_like(pad: bool) -> SimpleNamespace:
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(32, 500, bias=False)
    return SimpleNamespace(lm_head=lm_head, _pad_lm_head_rows=pad)


@pytest.mark.parametrize("rows", [1, 6, 7, 8, 15, 16, 17])
def test_padded_rows_give_each_row_its_own_logits(rows):
    hidden = torch.randn(rows, 32)  # [R, hidden]
    padded = TargetModel.logits(target_like(pad=True), hidden)
    plain = TargetModel.logits(target_like(pad=False), hidden)
    assert padded.shape == (rows, 500) and padded.dtype == torch.float32
    torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-5)
    one_by_one = torch.cat([TargetModel.logits(target_like(pad=False), h[None]) for h in hidden])
    torch.testing.assert_close(padded, one_by_one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "seen"), [(6, 6), (8, 16), (15, 16), (16, 16), (17, 17)])
def test_only_the_slow_row_counts_are_padded(rows, seen):
    target = target_like(pad=True)
    shapes = []
    target.lm_head.register_forward_hook(lambda module, args, out: shapes.append(args[0].shape[0]))
    TargetModel.logits(target, torch.randn(rows, 32))
    assert shapes == [seen]
