"""Start-up compilation: run each compiled forward once on dummy inputs, so that no request waits
for torch.compile and the server reports healthy only once every graph exists.

Dummy forwards write their K/V into block 0, which no sequence holds yet.
"""

from __future__ import annotations

import logging
import time

import torch
from tqdm import tqdm

from eagle_core.worker.inputs import SeqGroup, causal_group

logger = logging.getLogger(__name__)


def dummy_groups(block_size: int, tree: bool) -> list[SeqGroup]:
    """Two decode tokens and a 3-token prefill chunk, plus two 3-node trees when `tree`: every
    kind of group the step packs, each dimension at least 2."""
    groups = [
        causal_group([[1], [2]], [0, 1], [[0], [0]], block_size),
        causal_group([[1, 2, 3]], [0], [[0]], block_size),
    ]
    if tree:
        ancestors = torch.tensor([[True, False, False], [True, True, False], [True, False, True]])
        groups.append(
            SeqGroup(
                token_ids=torch.tensor([[1, 2, 3], [4, 5, 6]]),
                start_pos=torch.tensor([0, 1]),
                block_tables=torch.zeros(2, 1, dtype=torch.long),
                key_len=4,
                positions=torch.tensor([[0, 1, 1], [1, 2, 2]]),
                committed_len=torch.tensor([0, 1]),
                tail_mask=ancestors.expand(2, 3, 3).clone(),
            )
        )
    return groups


def warm_up(runner) -> float:
    """Compile the runner's forwards (target, draft head); returns the seconds it took."""
    start = time.perf_counter()
    models = [runner.target] + ([runner.drafter] if hasattr(runner, "drafter") else [])
    with tqdm(total=len(models), desc="compiling forwards", unit="model") as bar:
        for model in models:
            model.warm_up()
            bar.update()
    seconds = time.perf_counter() - start
    logger.info("compiled forwards ready in %.1f s", seconds)
    return seconds
