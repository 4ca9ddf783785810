"""bench.prefix_cache's summary and table on hand-made rows (no server)."""

from __future__ import annotations

import pytest

from bench.prefix_cache import CACHE, NO_CACHE, render, summarize


def row(server: str, second_ttft: float, text: str = "a", tau: float | None = 2.0) -> dict:
    return {"server": server, "question": "q", "first_ttft_s": 0.05, "second_ttft_s": second_ttft,
            "first_prompt_tokens": 40, "second_prompt_tokens": 300, "first_cached_tokens": 0,
            "second_cached_tokens": 240 if server == CACHE else 0, "first_completion_tokens": 10,
            "second_completion_tokens": 10, "first_acceptance_length": tau, "second_acceptance_length": tau,
            "first_text": "x", "second_text": text}


def test_summary_pairs_conversations_in_order_and_counts_identical_texts():
    rows = [row(CACHE, 0.05), row(NO_CACHE, 0.2), row(NO_CACHE, 0.2, "b"), row(CACHE, 0.1, "c", tau=None)]
    shared = [{"server": NO_CACHE, "output_tok_s": 40.0, "ttft_p50_s": 3.0, "ttft_p90_s": 9.0, "prompt_tokens": 100,
               "cached_tokens": 0}]
    summary = summarize(rows, shared)
    assert summary["second_ttft_ratio_median"] == pytest.approx(0.375)  # median of 0.25 and 0.5
    assert summary["same_text"] == 0.5
    assert summary[CACHE]["second_acceptance_length"] == 2.0  # a missing tau is left out
    text = render({"summary": summary, "machine": {"cpu": "cpu"}, "settings": {
        "command": "c", "max_tokens": 200, "conversations": 2, "system_tokens": 1000, "clients": 16,
        "shared_requests": 32, "shared_max_tokens": 64}})
    assert "| prefix-caching | 50 | 75 | 300 | 240 | 2.00 | 2.00 |" in text
    assert "0.38" in text and "| no-prefix-caching | 40.0 | 3000 | 9000 | 100 | 0 |" in text
