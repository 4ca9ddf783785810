"""The serving step (paged attention, compiled) against the reference (gather attention, eager):
the same greedy text and the same seeded samples, plain and speculative, on several
architectures; and one compiled graph per model for every batch and context size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle_core import SamplingParams
from eagle_core.worker import compiled
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import random_head_dir

REPO_ROOT = Path(__file__).resolve().parents[2]

# (compile, attention backend): the reference first; the compiled step comes last
STEPS = [("off", "gather"), ("off", "paged"), (None, "paged")]


# one compiled mode per architecture: each compilation costs tens of seconds
@pytest.mark.parametrize(("arch", "compiled_mode"), [("llama", "on"), ("qwen3", "max-autotune")])
def test_greedy_text_is_identical_with_and_without_compilation_and_across_backends(
    tiny_model_dirs, tmp_path, arch, compiled_mode
):
    target = tiny_model_dirs[arch]
    head = random_head_dir(target, tmp_path / "head")
    # prompts long enough for chunked prefill next to decoding sequences (max_num_batched_tokens)
    prompts = random_prompts(21, [3, 9, 40, 75, 17], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = {}
    for compile_mode, backend in STEPS:
        compile_mode = compile_mode or compiled_mode
        for draft in (None, str(head)):
            engine = make_engine(target, draft=draft, compile=compile_mode, attention_backend=backend,
                                 max_num_batched_tokens=64)
            outputs[compile_mode, backend, draft] = run_staggered(engine, prompts, params, first=2)
    reference = outputs["off", "gather", None]
    assert all(len(tokens) == 24 for tokens in reference.values())
    for key, got in outputs.items():
        assert got == reference, key


def test_seeded_sampling_under_compiled_speculation_equals_eager_plain_decoding(tiny_model_dirs, tmp_path):
    target = tiny_model_dirs["llama"]
    head = random_head_dir(target, tmp_path / "head")
    prompts = random_prompts(22, [4, 12, 30], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=20, ignore_eos=True)
    plain = run_staggered(make_engine(target), prompts, params)
    compiled = run_staggered(make_engine(target, draft=str(head), compile="on"), prompts, params)
    assert compiled == plain
    alone = run_staggered(make_engine(target, draft=str(head), compile="on"), prompts[1:2], params)
    assert alone["0"] == plain["1"]


def test_one_compiled_graph_serves_every_batch_and_context(tiny_model_dirs, tmp_path):
    """After start-up, batches of 1..6 sequences, prefill chunks, trees and lookup chains never
    recompile (torch.compile would raise under fail_on_recompile)."""
    target = tiny_model_dirs["llama"]
    head = random_head_dir(target, tmp_path / "head")
    engine = make_engine(target, draft=str(head), compile="on", max_num_batched_tokens=48)
    prompts = random_prompts(23, [1, 2, 5, 33, 60, 7], TINY_VOCAB_SIZE)
    with torch.compiler.set_stance("fail_on_recompile"):
        outputs = run_staggered(engine, prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), first=1)
    assert sorted(len(tokens) for tokens in outputs.values()) == [30] * 6
    assert engine.worker.warm_up_seconds > 0


# Run in a fresh process: inductor's weight packing is fixed per process at its first compilation.
CACHE_PROBE = """
import json, sys
from torch._dynamo.utils import counters
from eagle_core import SamplingParams
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE

packing, target = sys.argv[1], sys.argv[2]
prompts = random_prompts(24, [5, 19], TINY_VOCAB_SIZE)
params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
runs = []
for _ in range(2):
    before = dict(counters["inductor"])
    outputs = run_staggered(make_engine(target, compile="on", weight_packing=packing), prompts, params)
    runs.append({"outputs": outputs, **{key: counters["inductor"][key] - before.get(key, 0)
                                         for key in ("fxgraph_cache_hit", "fxgraph_cache_bypass")}})
print(json.dumps(runs))
"""


def test_unpacked_graphs_come_back_from_the_compile_cache(tiny_model_dirs, tmp_path):
    """--weight-packing none: a second engine's compiled graph loads from inductor's FX graph
    cache (what makes a second start short; graphs with packed weights bypass that cache) and
    decodes the eager reference's greedy text."""
    target = tiny_model_dirs["llama"]
    prompts = random_prompts(24, [5, 19], TINY_VOCAB_SIZE)
    reference = run_staggered(make_engine(target), prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", CACHE_PROBE, "none", str(target)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [run["outputs"] for run in runs] == [reference, reference]
    assert [(run["fxgraph_cache_bypass"], run["fxgraph_cache_hit"]) for run in runs] == [(0, 0), (0, 1)]


def test_one_process_compiles_with_one_weight_packing(monkeypatch):
    monkeypatch.setattr(compiled, "_process_packing", True)
    with pytest.raises(ValueError, match="both with and without packed weights"):
        compiled.CompiledFunction(lambda x: x, torch.device("cpu"), compiled.CompileSettings(pack_weights=False))
