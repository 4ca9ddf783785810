"""Statistics of the benchmark: percentiles, the per-token latency split, rates and ratios.

Pure Python (no numpy, no I/O) so every formula is unit-tested on fixed numbers
(tests/unit/test_bench_stats.py). Times are in seconds here; reports convert to ms.

Per-token latency, the convention used throughout: a stream delivers chunks; chunk i carries
k_i tokens and arrives g_i seconds after chunk i-1. Each of its k_i tokens is counted as one
latency sample of g_i / k_i (a speculative step that delivers 4 tokens after 80 ms is four
20 ms tokens, not one 80 ms chunk). The first token's latency is the TTFT; the other tokens of
the first chunk arrived with it and count 0. So the samples of one request sum to
t_last_chunk - t_first_chunk, and their mean is the request's time per output token (TPOT).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between order statistics
    (numpy's default method); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside [0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """{"n", "mean", "p50", "p90", "p99"} of `values` times `scale` (1000: seconds -> ms)."""
    out: dict[str, float | None] = {"n": len(values)}
    out["mean"] = sum(values) * scale / len(values) if values else None
    for q in PERCENTILES:
        p = percentile(values, q)
        out[f"p{q}"] = None if p is None else p * scale
    return out


def apportion(estimates: Sequence[float], total: int) -> list[int]:
    """Integer token counts per chunk that sum to `total` (the server's exact usage count),
    shaped like `estimates` (tokens found by re-tokenizing each chunk's text).

    Every chunk gets at least one token (a content chunk is only sent when a step produced
    one); the rest is shared in proportion to `estimates - 1` by largest remainder (ties to the
    earlier chunk). With fewer tokens than chunks, the earliest chunks get one each.
    """
    n = len(estimates)
    if total < 0:
        raise ValueError("total must be >= 0")
    if n == 0:
        return []
    if total <= n:
        return [1] * total + [0] * (n - total)
    spare = total - n
    weights = [max(e - 1.0, 0.0) for e in estimates]
    if sum(weights) == 0:
        weights = [1.0] * n
    shares = [spare * w / sum(weights) for w in weights]
    counts = [1 + math.floor(s) for s in shares]
    left = total - sum(counts)
    by_remainder = sorted(range(n), key=lambda i: (-(shares[i] - math.floor(shares[i])), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return counts


def per_token_latencies(
    sent_at: float, chunk_times: Sequence[float], chunk_tokens: Sequence[int]
) -> tuple[float | None, list[float]]:
    """(TTFT, per-token latency samples) of one streamed request; see the module docstring.

    A chunk counted with 0 tokens passes its gap on to the next chunk that has tokens.
    """
    if len(chunk_times) != len(chunk_tokens):
        raise ValueError("one token count per chunk")
    samples: list[float] = []
    ttft = None
    previous = None
    for t, k in zip(chunk_times, chunk_tokens):
        if k <= 0:
            continue
        if ttft is None:
            ttft = t - sent_at
            samples.extend([0.0] * (k - 1))
        else:
            samples.extend([(t - previous) / k] * k)
        previous = t
    return ttft, samples


def rate(tokens: float, seconds: float) -> float | None:
    """tokens / seconds, None when no time passed."""
    return tokens / seconds if seconds > 0 else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def acceptance_length(spec_decodes: Sequence[dict]) -> float | None:
    """Mean acceptance length over requests: emitted tokens / target forwards, summed before
    dividing (a long answer weighs more than a short one), from each choice's `spec_decode`."""
    steps = sum(s.get("num_steps", 0) for s in spec_decodes)
    emitted = sum(s.get("num_steps", 0) * s.get("mean_acceptance_length", 0.0) for s in spec_decodes)
    return ratio(emitted, steps)


def acceptance_by_depth(accepted_per_pos: Sequence[float], num_drafts: float) -> list[float | None]:
    """Fraction of drafted steps whose accepted path reached each depth (position k counts the
    steps that accepted at least k + 1 draft tokens), from the /metrics counters."""
    return [ratio(a, num_drafts) for a in accepted_per_pos]
