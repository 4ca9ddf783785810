"""The draft head's training objectives and validation metrics (eagle_core/train/trainer.py)."""

from __future__ import annotations

import math

import pytest
import torch

from eagle_core.train.config import TrainerConfig
from eagle_core.train.trainer import ttt_loss


def batch(label_ids, label_probs, weights=None):
    """One sequence of len(label_ids) positions; label_ids [T, k] draft ids (-1: out of vocab)."""
    ids = torch.tensor(label_ids)[None]
    probs = torch.tensor(label_probs, dtype=torch.float32)[None]
    w = torch.ones(ids.shape[:2]) if weights is None else torch.tensor(weights, dtype=torch.float32)[None]
    return {"label_ids": ids, "label_probs": probs, "weights": w}


def logits_for(q: list[float]) -> torch.Tensor:
    """[1, 1, V] logits whose softmax is q."""
    return torch.tensor(q).log()[None, None]


def test_soft_ce_is_cross_entropy_against_the_renormalised_in_vocab_distribution():
    # target: token 0 (p 0.5), token 2 (p 0.2), one token outside the draft vocabulary (p 0.3)
    b = batch([[0, 2, -1]], [[0.5, 0.2, 0.3]])
    q = [0.4, 0.3, 0.2, 0.1]
    loss, _ = ttt_loss([logits_for(q)], b, decay=0.8)
    expected = -(5 / 7 * math.log(0.4) + 2 / 7 * math.log(0.2))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_lk_is_minus_log_of_the_sampled_drafts_acceptance_plus_weighted_soft_ce():
    b = batch([[0, 2, -1]], [[0.5, 0.2, 0.3]])
    q = [0.4, 0.3, 0.2, 0.1]
    loss, _ = ttt_loss([logits_for(q)], b, decay=0.8, objective="lk", lk_ce_weight=0.5)
    accepted = min(0.5, 0.4) + min(0.2, 0.2)  # the out-of-vocabulary mass is unreachable
    soft_ce = -(5 / 7 * math.log(0.4) + 2 / 7 * math.log(0.2))
    assert loss.item() == pytest.approx(-math.log(accepted) + 0.5 * soft_ce, rel=1e-5)


def test_an_lk_gradient_step_raises_the_acceptance_rate():
    b = batch([[1, 3, 0]], [[0.6, 0.25, 0.1]])
    logits = torch.zeros(1, 1, 6, requires_grad=True)

    def acceptance(lg):
        q = lg.detach().softmax(-1)[0, 0]
        return min(0.6, q[1].item()) + min(0.25, q[3].item()) + min(0.1, q[0].item())

    before = acceptance(logits)
    loss, _ = ttt_loss([logits], b, decay=0.8, objective="lk", lk_ce_weight=0.0)
    loss.backward()
    stepped = logits - 1.0 * logits.grad
    assert acceptance(stepped) > before + 0.05


def test_stats_give_the_targets_mass_on_the_heads_top_1_and_top_3():
    # draft vocabulary of 6; target top-4: ids 4 (0.4), 1 (0.3), 5 (0.1), out of vocab (0.1)
    b = batch([[4, 1, 5, -1]], [[0.4, 0.3, 0.1, 0.1]])
    # head ranks 1, 3, 4 first: top-1 mass 0.3, top-3 mass 0.3 + 0 + 0.4
    head = torch.tensor([[[0.0, 5.0, 0.0, 4.0, 3.0, 0.0]]])
    _, (st,) = ttt_loss([head], b, decay=0.8)
    assert st.count == 1
    assert st.hits == 0  # the head's top-1 (1) is not the target's (4)
    assert st.mass1 == pytest.approx(0.3)
    assert st.mass3 == pytest.approx(0.7)
    assert st.ceiling1 == pytest.approx(0.4)
    assert st.ceiling3 == pytest.approx(0.8)


def test_stats_count_only_full_weight_positions_with_a_full_chain():
    b = batch([[0, 1], [0, 1], [0, 1]], [[0.9, 0.1]] * 3, weights=[0.2, 1.0, 1.0])
    head = torch.tensor([[[5.0, 0.0]] * 3])
    _, (st0, st1) = ttt_loss([head, head], b, decay=0.8)
    assert st0.count == 2  # the prompt position (weight 0.2) is not counted
    assert st1.count == 2  # step 1 has no entry at position 0; position 0 was a prompt one anyway
    assert st0.mass1 == pytest.approx(1.8)


def test_config_rejects_unknown_objectives_and_negative_weights():
    with pytest.raises(ValueError, match="objective"):
        TrainerConfig(objective="kl")
    with pytest.raises(ValueError, match="lk_ce_weight"):
        TrainerConfig(objective="lk", lk_ce_weight=-1)


def test_on_policy_answers_weigh_the_tokens_the_head_did_not_supply():
    from eagle_core.train.features import _weights

    # 3 prompt tokens, 4 answer tokens of which the head supplied the 2nd and 3rd, then the end
    seq = {"ids": list(range(8)), "num_prompt": 3, "drafted": [0, 1, 1, 0]}
    w = _weights(seq, prompt_weight=0.2, missed_weight=3.0).tolist()
    # position t predicts token t+1: 0-1 inside the prompt; 2-5 the answer; 6 the end; 7 nothing
    assert w == pytest.approx([0.2, 0.2, 3.0, 1.0, 1.0, 3.0, 1.0, 0.0], abs=1e-3)
    plain = {"ids": list(range(8)), "num_prompt": 3, "drafted": None}
    assert _weights(plain, 0.2, 3.0).tolist() == pytest.approx([0.2, 0.2, 1, 1, 1, 1, 1, 0], abs=1e-3)
    truncated = {"ids": list(range(5)), "num_prompt": 3, "drafted": [0, 1, 1, 0]}
    assert _weights(truncated, 0.2, 3.0).tolist() == pytest.approx([0.2, 0.2, 3.0, 1.0, 0.0], abs=1e-3)
