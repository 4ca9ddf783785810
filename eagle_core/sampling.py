"""Turning logits into tokens: penalties, temperature and filters, seeded draws.

Every random draw goes through the request's own `torch.Generator`, so a seeded request samples
the same tokens alone or inside any batch.
"""

from __future__ import annotations

import torch


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from `probs` ([vocab], sums to 1) with the request's generator.

    Exponential race (argmax of p / E, E ~ Exp(1)) instead of torch.multinomial: one pass over
    the vocabulary, no cumulative sum, and exactly distributed as `probs`.
    """
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return int(torch.argmax(probs.float() / noise).item())
