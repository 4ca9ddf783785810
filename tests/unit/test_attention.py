"""The hand-written single-query attention against torch's sdpa on float32 inputs."""

import pytest
import torch
import torch.nn.functional as F

from eagle_core.worker.attn_gather import single_query_attention


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("batch, keys", [(1, 7), (5, 130)])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_sdpa(heads, kv_heads, batch, keys, masked):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, 1, 16, dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, keys, 16, dtype=torch.bfloat16)
    v = torch.randn(batch, kv_heads, keys, 16, dtype=torch.bfloat16)
    mask = None
    if masked:  # padding: sequence b sees its first keys - 2b positions
        lengths = torch.tensor([keys - 2 * b for b in range(batch)])
        mask = (torch.arange(keys)[None, :] < lengths[:, None])[:, None, None, :]  # [B, 1, 1, L]
    expected = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, scale=0.3, enable_gqa=heads != kv_heads
    )
    got = single_query_attention(q, k, v, mask, 0.3)
    assert got.dtype == torch.bfloat16 and got.shape == (batch, heads, 1, 16)
    torch.testing.assert_close(got.float(), expected, atol=1e-2, rtol=1e-2)


def test_masked_keys_do_not_contribute():
    """A masked key whose value is huge must not move the output."""
    torch.manual_seed(1)
    q = torch.randn(1, 2, 1, 8)
    k = torch.randn(1, 1, 4, 8)
    v = torch.randn(1, 1, 4, 8)
    mask = torch.tensor([True, True, True, False])[None, None, None, :]
    base = single_query_attention(q, k, v, mask, None)
    v[0, 0, 3] = 1e4
    torch.testing.assert_close(single_query_attention(q, k, v, mask, None), base)
