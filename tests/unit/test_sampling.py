"""Sampling: penalties, temperature and filters, seeded draws, logprobs (CPU, no model)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from eagle_core.errors import InvalidRequestError
from eagle_core.sampling import (
    apply_logit_bias,
    apply_penalties,
    compute_logprobs,
    draw,
    hold_back_stop_tokens,
    position_uniforms,
    processed_probs,
    request_key,
    sample_from_probs,
)
from eagle_core.sampling_params import SamplingParams


def logits_of(probs: list[float]) -> torch.Tensor:  # [1, vocab]
    return torch.log(torch.tensor([probs], dtype=torch.float32))


def draw_counts(probs: torch.Tensor, num_draws: int, seed: int) -> torch.Tensor:  # [vocab]
    """Empirical counts of one request's draws from one row of probabilities at output
    positions 0 .. num_draws - 1."""
    keys = torch.full((num_draws,), request_key(seed))
    tokens = draw(probs.expand(num_draws, -1), keys, torch.arange(num_draws), [False] * num_draws)
    return torch.bincount(tokens, minlength=probs.shape[-1])


def greedy_draw(probs: torch.Tensor) -> list[int]:
    rows = probs.shape[0]
    return draw(probs, torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long), [True] * rows).tolist()


def chisquare_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of draw counts to `probs` (expected counts in float64, exact total)."""
    expected = probs.double() / probs.double().sum() * counts.sum().item()
    return float(stats.chisquare(counts.numpy(), expected.numpy()).pvalue)


# --- sample_from_probs ----------------------------------------------------------------------


def test_sample_from_probs_matches_distribution():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    num_draws = 20_000
    counts = draw_counts(probs, num_draws, seed=1234)
    assert chisquare_pvalue(counts, probs) > 0.001, counts


def test_sample_from_probs_never_picks_zero_probability():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    counts = draw_counts(probs, 2000, seed=7)
    assert counts[[0, 2, 4]].sum() == 0
    assert counts[1] > 0 and counts[3] > 0


# --- greedy ---------------------------------------------------------------------------------


def test_greedy_is_one_hot_argmax_with_lowest_index_on_ties():
    logits = torch.tensor([[0.1, 3.0, -1.0, 3.0], [5.0, 1.0, 2.0, 0.0]])
    greedy = SamplingParams(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9)
    probs = processed_probs(logits, [greedy, greedy])
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 9e-6])
def test_temperatures_too_small_to_divide_by_are_greedy(temperature):
    """Logits divided by 1e-38 overflow fp32 (NaN probabilities, token 0 picked): such
    temperatures decode greedily instead."""
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.5]])
    params = SamplingParams(temperature=temperature)
    assert params.greedy
    assert torch.equal(processed_probs(logits, [params]), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    assert not SamplingParams(temperature=1e-5).greedy


def test_greedy_rows_take_the_argmax():
    probs = torch.tensor([[0.1, 0.7, 0.2], [0.3, 0.3, 0.4]])
    assert greedy_draw(probs) == [1, 2]


# --- temperature ----------------------------------------------------------------------------


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    for temperature in (0.5, 1.0, 1.7):
        probs = processed_probs(logits, [SamplingParams(temperature=temperature)])
        torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=1))


def test_temperature_changes_empirical_distribution():
    logits = logits_of([0.5, 0.3, 0.2])
    num_draws = 4000
    sharp = processed_probs(logits, [SamplingParams(temperature=0.5)])[0]
    flat = processed_probs(logits, [SamplingParams(temperature=1.5)])[0]
    sharp_counts = draw_counts(sharp, num_draws, seed=11)
    flat_counts = draw_counts(flat, num_draws, seed=11)
    # Expected top-token shares: 0.66 (T=0.5) vs 0.43 (T=1.5), ~0.5 at T=1.
    assert sharp_counts[0] / num_draws > 0.62
    assert flat_counts[0] / num_draws < 0.47
    table = torch.stack([sharp_counts, flat_counts]).numpy()
    assert stats.chi2_contingency(table).pvalue < 1e-6
    # And each matches its own tempered distribution.
    assert chisquare_pvalue(sharp_counts, sharp) > 0.001
    assert chisquare_pvalue(flat_counts, flat) > 0.001


# --- top-k ----------------------------------------------------------------------------------


def test_top_k_keeps_exactly_the_top_k():
    logits = logits_of([0.1, 0.35, 0.05, 0.3, 0.2])
    probs = processed_probs(logits, [SamplingParams(top_k=2)])[0]
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.35, 0.0, 0.3, 0.0]) / 0.65)
    counts = draw_counts(probs, 1000, seed=3)
    assert counts[[0, 2, 4]].sum() == 0
    assert counts[1] > 0 and counts[3] > 0


@pytest.mark.parametrize("top_k", [0, -1, 5, 2**63, 10**30])
def test_top_k_disabled(top_k):
    """0 and -1 turn top-k off; so does any top_k of at least the vocabulary's size, however
    large (2**63 does not fit in an int64 tensor)."""
    logits = logits_of([0.1, 0.35, 0.05, 0.3, 0.2])
    probs = processed_probs(logits, [SamplingParams(top_k=top_k)])
    torch.testing.assert_close(probs, torch.softmax(logits, dim=1))


# --- top-p ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.4, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_smallest_set_reaching_mass(top_p, kept):
    base = [0.5, 0.3, 0.15, 0.05]
    probs = processed_probs(logits_of(base), [SamplingParams(top_p=top_p)])[0]
    expected = torch.tensor([base[i] if i in kept else 0.0 for i in range(4)])
    torch.testing.assert_close(probs, expected / expected.sum())


def test_top_p_draws_stay_in_nucleus():
    probs = processed_probs(logits_of([0.5, 0.3, 0.15, 0.05]), [SamplingParams(top_p=0.75)])[0]
    counts = draw_counts(probs, 1000, seed=4)
    assert counts[2] == 0 and counts[3] == 0
    assert counts[0] > 0 and counts[1] > 0


def test_top_p_applies_to_mass_renormalised_after_top_k():
    # Over all 4 tokens the 0.65 nucleus holds 3; over the top-3 survivors it holds 2.
    logits = logits_of([0.3, 0.3, 0.2, 0.2])
    probs = processed_probs(logits, [SamplingParams(top_k=3, top_p=0.65)])[0]
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.5, 0.0, 0.0]))


# --- min-p ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("min_p", "kept"), [(0.0, [0, 1, 2, 3]), (0.2, [0, 1, 2]), (0.5, [0, 1]), (1.0, [0])]
)
def test_min_p_drops_tokens_below_fraction_of_max(min_p, kept):
    base = [0.5, 0.3, 0.15, 0.05]
    probs = processed_probs(logits_of(base), [SamplingParams(min_p=min_p)])[0]
    expected = torch.tensor([base[i] if i in kept else 0.0 for i in range(4)])
    torch.testing.assert_close(probs, expected / expected.sum())


def test_min_p_draws():
    probs = processed_probs(logits_of([0.5, 0.3, 0.15, 0.05]), [SamplingParams(min_p=0.5)])[0]
    counts = draw_counts(probs, 1000, seed=5)
    assert counts[2] == 0 and counts[3] == 0 and counts[1] > 0


# --- batches mixing options -----------------------------------------------------------------


def test_processed_probs_rows_are_independent_and_normalised():
    torch.manual_seed(0)
    logits = torch.randn(5, 50) * 3  # [num_rows, vocab]
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=5, temperature=0.7),
        SamplingParams(top_p=0.6, min_p=0.05),
        SamplingParams(temperature=1.3),
    ]
    batched = processed_probs(logits, params)
    assert batched.dtype == torch.float32
    torch.testing.assert_close(batched.sum(dim=1), torch.ones(5))
    for i, p in enumerate(params):
        torch.testing.assert_close(batched[i : i + 1], processed_probs(logits[i : i + 1], [p]))
    torch.testing.assert_close(batched[0:1], torch.softmax(logits[0:1], dim=1))
    assert (batched[2] > 0).sum() == 5


def test_processed_probs_bf16_input_gives_float32():
    logits = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    probs = processed_probs(logits, [SamplingParams(top_k=2)])
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(1))


# --- penalties ------------------------------------------------------------------------------

LOGITS = [1.0, -2.0, 3.0, 0.5, 0.0]
PROMPT = [3]
OUTPUT = [2, 2, 1]


def penalised(**kwargs) -> list[float]:
    out = apply_penalties(torch.tensor([LOGITS]), [PROMPT], [OUTPUT], [SamplingParams(**kwargs)])
    return out[0].tolist()


def test_presence_penalty_subtracts_once_per_output_token():
    assert penalised(presence_penalty=0.5) == pytest.approx([1.0, -2.5, 2.5, 0.5, 0.0])


def test_frequency_penalty_subtracts_per_occurrence():
    assert penalised(frequency_penalty=0.25) == pytest.approx([1.0, -2.25, 2.5, 0.5, 0.0])


def test_negative_presence_and_frequency_penalties_encourage():
    assert penalised(presence_penalty=-1.0, frequency_penalty=-0.5) == pytest.approx(
        [1.0, -0.5, 5.0, 0.5, 0.0]
    )


def test_repetition_penalty_divides_positive_multiplies_negative_prompt_included():
    # Token 3 appears only in the prompt and is still penalised; tokens 0 and 4 are untouched.
    assert penalised(repetition_penalty=2.0) == pytest.approx([1.0, -4.0, 1.5, 0.25, 0.0])


def test_penalties_combine_repetition_first():
    got = penalised(repetition_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5)
    assert got == pytest.approx([1.0, -4.75, 0.5, 0.25, 0.0])


def test_penalties_per_row_history_and_untouched_rows():
    # Rows 0 and 2 belong to one request at two draft-tree nodes with different paths.
    logits = torch.tensor([LOGITS, LOGITS, LOGITS])  # [num_rows, vocab]
    params = SamplingParams(presence_penalty=1.0)
    out = apply_penalties(
        logits,
        [PROMPT, PROMPT, PROMPT],
        [[0], [0, 1, 2], [0, 4]],
        [params, SamplingParams(), params],
    )
    assert out[0].tolist() == pytest.approx([0.0, -2.0, 3.0, 0.5, 0.0])
    assert torch.equal(out[1], logits[1])
    assert out[2].tolist() == pytest.approx([0.0, -2.0, 3.0, 0.5, -1.0])
    assert torch.equal(logits, torch.tensor([LOGITS] * 3)), "input must not be modified"


def test_penalties_skipped_when_no_row_needs_them():
    logits = torch.tensor([LOGITS])
    out = apply_penalties(logits, [PROMPT], [OUTPUT], [SamplingParams(temperature=0.0)])
    assert torch.equal(out, logits)


def test_penalties_change_greedy_choice():
    params = SamplingParams(temperature=0.0, frequency_penalty=2.0)
    logits = apply_penalties(torch.tensor([LOGITS]), [PROMPT], [OUTPUT], [params])
    probs = processed_probs(logits, [params])
    assert greedy_draw(probs) == [0]


def test_penalties_with_empty_histories():
    logits = torch.tensor([LOGITS])
    out = apply_penalties(logits, [[]], [[]], [SamplingParams(repetition_penalty=1.5)])
    assert torch.equal(out, logits)


# --- min_tokens -----------------------------------------------------------------------------


def test_logit_bias_adds_to_its_rows_tokens_only():
    logits = torch.zeros(3, 5)
    params = [SamplingParams(logit_bias={4: -100, 1: 2.5}), SamplingParams(), SamplingParams(logit_bias={0: 1})]
    out = apply_logit_bias(logits, params)
    assert out.tolist() == [[0, 2.5, 0, 0, -100], [0] * 5, [1, 0, 0, 0, 0]]
    assert logits.abs().sum() == 0  # a new tensor
    assert apply_logit_bias(logits, [SamplingParams()] * 3) is logits


def test_logit_bias_bans_and_forces_greedy_choices():
    logits = logits_of([0.1, 0.6, 0.3])
    banned = apply_logit_bias(logits, [SamplingParams(temperature=0, logit_bias={1: -100})])
    forced = apply_logit_bias(logits, [SamplingParams(temperature=0, logit_bias={0: 100})])
    assert processed_probs(banned, [SamplingParams(temperature=0)]).argmax().item() == 2
    assert processed_probs(forced, [SamplingParams(temperature=0)]).argmax().item() == 0


@pytest.mark.parametrize("bias", [{0: 100.5}, {0: float("nan")}, {-1: 1}, {0: "1"}, {0: True}, {True: 1}])
def test_logit_bias_is_validated(bias):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(logit_bias=bias)
    assert err.value.param == "logit_bias"


def test_min_tokens_holds_back_stop_tokens_only_in_rows_short_of_it():
    logits = torch.zeros(3, 6)  # [rows, vocab]
    params = [SamplingParams(min_tokens=2), SamplingParams(min_tokens=2), SamplingParams()]
    stops = [frozenset({1, 4, 99}), frozenset({1, 4}), frozenset({1})]  # 99: past this vocab
    out = hold_back_stop_tokens(logits, [1, 2, 0], params, stops)
    assert out[0].tolist() == [0, -math.inf, 0, 0, -math.inf, 0]  # 1 token out, 2 needed
    assert out[1].tolist() == [0.0] * 6 and out[2].tolist() == [0.0] * 6
    assert logits.eq(0).all()  # the caller's tensor is not modified
    probs = processed_probs(out, [SamplingParams(temperature=0.0, min_tokens=2)] * 3)
    assert probs[0, 1] == 0 and probs[0, 4] == 0


@pytest.mark.parametrize("penalty", [0.0, -1.0, math.nan, math.inf, 1e-300, 1e-7, 1e39, 1.1e6])
def test_repetition_penalty_must_be_finite_and_not_near_zero(penalty):
    with pytest.raises(InvalidRequestError, match="repetition_penalty") as err:
        SamplingParams(repetition_penalty=penalty)
    assert err.value.param == "repetition_penalty"


def test_the_largest_repetition_penalty_keeps_logits_finite():
    logits = torch.tensor([[0.0, 3.0, -30.0, 1.0]])
    out = apply_penalties(logits, [[0, 1, 2]], [[]], [SamplingParams(repetition_penalty=1e6)])
    assert torch.isfinite(out).all()


def test_min_tokens_is_checked_against_max_tokens():
    with pytest.raises(InvalidRequestError, match="min_tokens") as err:
        SamplingParams(min_tokens=5, max_tokens=4)
    assert err.value.param == "min_tokens"
    with pytest.raises(InvalidRequestError):
        SamplingParams(min_tokens=-1)
    SamplingParams(min_tokens=4, max_tokens=4)


# --- generators and reproducibility ---------------------------------------------------------


def test_seeded_draws_do_not_depend_on_batch_composition_or_order():
    """Nor on greedy rows beside them (a batch of sampled rows alone takes a shorter path)."""
    torch.manual_seed(1)
    probs = torch.softmax(torch.randn(3, 100), dim=1)  # [num_rows, vocab]: rows A, B, C

    def run(order: list[int], greedy_rows: frozenset[int] = frozenset()) -> dict[int, list[int]]:
        keys = torch.tensor([request_key(100 + row) for row in order])
        greedy = [row in greedy_rows for row in order]
        drawn: dict[int, list[int]] = {row: [] for row in order}
        for position in range(20):
            tokens = draw(probs[order], keys, torch.full((len(order),), position), greedy)
            for row, token in zip(order, tokens.tolist(), strict=True):
                drawn[row].append(token)
        return drawn

    alone = run([0])[0]
    assert run([1, 0, 2])[0] == alone
    assert run([2, 0])[0] == alone
    beside_greedy = run([1, 0, 2], greedy_rows=frozenset({1}))
    assert beside_greedy[0] == alone and beside_greedy[2] == run([2])[2]
    assert beside_greedy[1] == [int(probs[1].argmax())] * 20
    assert len(set(alone)) > 1


def test_seeded_draws_reproduce_and_differ_by_seed():
    probs = torch.full((1000,), 1e-3)

    def draws(key: int) -> list[int]:
        return [sample_from_probs(probs, key, position) for position in range(10)]

    assert draws(request_key(42)) == draws(request_key(42))
    assert draws(request_key(42)) != draws(request_key(43))


def test_unseeded_requests_get_different_keys():
    probs = torch.full((1000,), 1e-3)
    first, second = request_key(None), request_key(None)
    assert [sample_from_probs(probs, first, p) for p in range(10)] != [sample_from_probs(probs, second, p) for p in range(10)]


@pytest.mark.parametrize("seed", [-1, 0, 2**64 + 5, 10**30])
def test_any_int_seed_gives_a_key(seed):
    assert request_key(seed) == seed % 2**63


def test_position_uniforms_are_uniform_across_positions_and_keys():
    positions = torch.arange(20_000)
    along_positions = position_uniforms(torch.full_like(positions, request_key(3)), positions)
    along_keys = position_uniforms(torch.arange(20_000) * 7919, torch.full_like(positions, 5))
    for sample in (along_positions, along_keys):
        assert 0.0 <= float(sample.min()) and float(sample.max()) < 1.0
        assert stats.kstest(sample.numpy(), "uniform").pvalue > 1e-3
    # consecutive positions are not correlated
    assert abs(float(torch.corrcoef(torch.stack([along_positions[:-1], along_positions[1:]]))[0, 1])) < 0.03


# --- logprobs -------------------------------------------------------------------------------


def test_compute_logprobs_hand_made():
    base = [0.5, 0.25, 0.125, 0.125]
    logits = torch.log(torch.tensor([base, base, base])) + 3.0  # [num_rows, vocab], unnormalised
    out = compute_logprobs(logits, [1, 3, 0], [2, None, 0])
    assert out[1] is None
    first = out[0]
    assert first.token_id == 1
    assert first.logprob == pytest.approx(math.log(0.25))
    assert [t for t, _ in first.top] == [0, 1]
    assert [lp for _, lp in first.top] == pytest.approx([math.log(0.5), math.log(0.25)])
    assert out[2].token_id == 0 and out[2].top == []
    assert out[2].logprob == pytest.approx(math.log(0.5))


def test_compute_logprobs_all_none():
    assert compute_logprobs(torch.zeros(2, 4), [0, 1], [None, None]) == [None, None]
