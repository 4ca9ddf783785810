"""bench/stats.py on fixed numbers: percentiles, the per-token latency split, apportioning
usage counts over chunks, rates, ratios and acceptance figures."""

from __future__ import annotations

import pytest

from bench import stats


def test_percentile_interpolates_between_order_statistics():
    values = [15, 20, 35, 40, 50]  # unsorted input must not matter: shuffled below
    shuffled = [40, 15, 50, 20, 35]
    assert stats.percentile(shuffled, 0) == 15
    assert stats.percentile(shuffled, 100) == 50
    assert stats.percentile(values, 50) == 35
    assert stats.percentile(values, 40) == pytest.approx(29.0)  # rank 1.6: 20 + 0.6 * 15
    assert stats.percentile(values, 90) == pytest.approx(46.0)  # rank 3.6: 40 + 0.6 * 10
    assert stats.percentile(values, 99) == pytest.approx(49.6)


def test_percentile_of_one_and_of_none():
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_percentiles_match_numpy_linear():
    np = pytest.importorskip("numpy")
    values = [0.013, 0.2, 0.021, 0.5, 0.017, 0.019, 0.018, 0.9, 0.02, 0.016, 0.03]
    for q in (1, 10, 50, 90, 99):
        assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_summarize_scales_to_milliseconds():
    s = stats.summarize([0.010, 0.020, 0.030, 0.040], scale=1000)
    assert s["n"] == 4
    assert s["mean"] == pytest.approx(25.0)
    assert s["p50"] == pytest.approx(25.0)
    assert s["p90"] == pytest.approx(37.0)
    assert s["p99"] == pytest.approx(39.7)
    assert stats.summarize([]) == {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_per_token_split_counts_each_token_of_a_chunk_at_gap_over_k():
    # sent at 10.0; chunks at 10.5 (1 token: TTFT 0.5), 10.6 (1 token after 0.1),
    # 10.8 (4 tokens after 0.2: four tokens of 0.05), 10.9 (2 tokens after 0.1: two of 0.05)
    ttft, samples = stats.per_token_latencies(10.0, [10.5, 10.6, 10.8, 10.9], [1, 1, 4, 2])
    assert ttft == pytest.approx(0.5)
    assert samples == pytest.approx([0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05])
    # the samples add up to the decode time, one per token after the first: their mean is TPOT
    assert sum(samples) == pytest.approx(10.9 - 10.5)
    assert len(samples) == 1 + 1 + 4 + 2 - 1


def test_per_token_split_first_chunk_extra_tokens_count_zero():
    ttft, samples = stats.per_token_latencies(0.0, [0.3, 0.5], [3, 1])
    assert ttft == pytest.approx(0.3)
    assert samples == pytest.approx([0.0, 0.0, 0.2])


def test_per_token_split_zero_token_chunk_passes_its_gap_on():
    ttft, samples = stats.per_token_latencies(0.0, [0.1, 0.2, 0.4], [1, 0, 2])
    assert ttft == pytest.approx(0.1)
    assert samples == pytest.approx([0.15, 0.15])  # gap 0.1 -> 0.4 over 2 tokens


def test_per_token_split_no_tokens():
    assert stats.per_token_latencies(0.0, [], []) == (None, [])
    with pytest.raises(ValueError):
        stats.per_token_latencies(0.0, [1.0], [])


def test_per_chunk_and_per_token_percentiles_differ():
    # one 4-token chunk after 0.4 s among 1-token chunks every 0.1 s: per chunk the p50 gap is
    # 0.1 and the largest 0.4; per token every gap is 0.1.
    ttft, samples = stats.per_token_latencies(0.0, [0.1, 0.2, 0.6, 0.7], [1, 1, 4, 1])
    assert max(samples) == pytest.approx(0.1)
    assert stats.percentile(samples, 99) == pytest.approx(0.1)


def test_apportion_matches_total_and_shape():
    assert stats.apportion([1, 1, 3, 1], 6) == [1, 1, 3, 1]  # estimates already right
    assert stats.apportion([1, 1, 1], 3) == [1, 1, 1]
    assert sum(stats.apportion([2, 1, 5, 1], 11)) == 11
    assert stats.apportion([1, 2, 1], 4) == [1, 2, 1]
    # more tokens than estimated: the spare goes where the estimates say several tokens came
    assert stats.apportion([1, 3, 1], 7) == [1, 5, 1]
    # estimates all 1 but the total is larger: spare shared evenly, ties to the earlier chunks
    assert stats.apportion([1, 1, 1], 5) == [2, 2, 1]
    # fewer tokens than chunks: earliest chunks get one each
    assert stats.apportion([1, 1, 1], 2) == [1, 1, 0]
    assert stats.apportion([], 0) == []
    with pytest.raises(ValueError):
        stats.apportion([1], -1)


def test_apportion_largest_remainder():
    # spare 3 over weights 1, 1, 1 (estimates 2, 2, 2), total 6 -> [2, 2, 2]
    assert stats.apportion([2, 2, 2], 6) == [2, 2, 2]
    # spare 4 over weights 2, 1 -> shares 2.67, 1.33 -> floors 2, 1, one left to the larger remainder
    assert stats.apportion([3, 2], 6) == [4, 2]


def test_rate_and_ratio():
    assert stats.rate(300, 12.0) == pytest.approx(25.0)
    assert stats.rate(10, 0.0) is None
    assert stats.ratio(45.0, 30.0) == pytest.approx(1.5)
    assert stats.ratio(1.0, 0.0) is None
    assert stats.ratio(None, 2.0) is None
    assert stats.ratio(2.0, None) is None


def test_speedup_is_the_ratio_of_token_rates():
    eagle = stats.rate(512, 8.0)  # 64 tok/s
    plain = stats.rate(480, 12.0)  # 40 tok/s
    assert stats.ratio(eagle, plain) == pytest.approx(1.6)


def test_acceptance_length_weights_by_steps():
    spec = [
        {"num_steps": 10, "mean_acceptance_length": 3.0},  # 30 tokens
        {"num_steps": 30, "mean_acceptance_length": 1.0},  # 30 tokens
    ]
    assert stats.acceptance_length(spec) == pytest.approx(60 / 40)
    assert stats.acceptance_length([]) is None


def test_acceptance_by_depth():
    assert stats.acceptance_by_depth([80, 50, 20, 0], 100) == pytest.approx([0.8, 0.5, 0.2, 0.0])
    assert stats.acceptance_by_depth([1], 0) == [None]
