"""--weight-quantization int4: the engine's decoder linears hold int4 weights (the LM head keeps
its own), plain and speculative engines run on them, and a request's tokens do not depend on its
batch when every step reads the int4 weights."""

from __future__ import annotations

import json
import shutil

import pytest

from eagle_core import SamplingParams, SpecConfig
from eagle_core.errors import ModelLoadError
from eagle_core.worker.cpu_kernels import int4_linear_available
from eagle_core.worker.int4_linear import Int4Linear
from eagle_core.worker.loader import SOURCE_TYPES_FILE
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import random_head_dir
from tests.unit.test_int4_linear import needs_amx

pytestmark = pytest.mark.skipif(not int4_linear_available(), reason="the int4 linear operator could not be built here")

TREE = SpecConfig(num_draft_tokens=8, depth=3, top_k=3, lookup_tokens=4)


def _int4_linears(engine) -> list[Int4Linear]:
    return [m for m in engine.worker.target.model.modules() if isinstance(m, Int4Linear)]


def test_the_decoders_linears_hold_int4_weights_and_speculation_runs_on_them(tiny_model_dirs, tmp_path):
    model_dir = tiny_model_dirs["llama"]
    head = random_head_dir(model_dir, tmp_path / "head")
    engine = make_engine(model_dir, draft=str(head), spec=TREE, dtype="bfloat16", weight_quantization="int4")
    assert engine.worker.weight_quantization == "int4"
    int4 = _int4_linears(engine)
    assert len(int4) == 7 * engine.worker.target.config.num_hidden_layers  # q, k, v, o, gate, up, down
    assert not isinstance(engine.worker.target.lm_head, Int4Linear)  # the LM head keeps its weights
    assert {m.row_limit for m in int4} <= {0, 1, 2, 4, 8, 16, 32} and len({m.row_limit for m in int4}) == 1
    prompts = random_prompts(3, [5, 30], TINY_VOCAB_SIZE)
    out = run_staggered(engine, prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), first=2)
    assert [len(tokens) for tokens in out.values()] == [16, 16]
    assert engine.spec_counters.num_drafts > 0


@pytest.mark.parametrize("tiles", [False, pytest.param(True, marks=needs_amx)])
def test_with_every_step_on_the_int4_kernel_a_requests_tokens_do_not_depend_on_its_batch(
    tiny_model_dirs, monkeypatch, tiles
):
    """Both int4 kernels compute each row alone: alone or beside other requests, greedy and
    seeded, the tokens are the same. Short prompts and a row limit of 32 put every step,
    prefills included, on the int4 weights (aten's kernel, or the AMX tile kernel)."""
    monkeypatch.setattr("eagle_core.worker.int4_linear.cpu_has_amx_bf16", lambda: tiles)
    model_dir = tiny_model_dirs["llama"]
    prompts = random_prompts(11, [3, 5, 6, 4, 6], TINY_VOCAB_SIZE)
    engine = make_engine(model_dir, dtype="bfloat16", weight_quantization="int4", max_num_seqs=5)
    for m in _int4_linears(engine):
        assert m.tiles is tiles
        m.row_limit = 32
    for params in (
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=20, ignore_eos=True),
    ):
        together = run_staggered(engine, prompts, params, first=2)
        alone = {}
        for i, prompt in enumerate(prompts):
            alone |= {str(i): run_staggered(engine, [prompt], params, first=1)["0"]}
        assert together == alone


def test_int4_is_refused_where_it_cannot_run(tiny_model_dirs):
    with pytest.raises(ModelLoadError, match="needs a bfloat16 model on the CPU"):
        make_engine(tiny_model_dirs["llama"], dtype="float32", weight_quantization="int4")


def _as_converted_from(model_dir, tmp_path, linear_type: str, other: dict[str, str] | None = None):
    """A copy of `model_dir` marked as converted from a GGUF whose decoder linears were
    `linear_type`, except those named in `other`."""
    copy = tmp_path / f"converted-{linear_type}-{len(other or {})}"
    shutil.copytree(model_dir, copy)
    types = {f"blk.{i}.{name}.weight": linear_type for i in range(2) for name in ("attn_q", "ffn_down")}
    types |= other or {}
    (copy / SOURCE_TYPES_FILE).write_text(json.dumps(types | {"token_embd.weight": "Q8_0"}))
    return copy


def test_auto_takes_int4_only_where_the_4bit_weights_are_the_sources_own(tiny_model_dirs, tmp_path):
    q4_1 = _as_converted_from(tiny_model_dirs["llama"], tmp_path, "Q4_1")
    assert make_engine(q4_1, dtype="bfloat16", weight_quantization="auto").worker.weight_quantization == "int4"
    # int4 cannot run here: auto falls back to the weights as loaded instead of refusing
    assert make_engine(q4_1, dtype="float32", weight_quantization="auto").worker.weight_quantization is None
    deterministic = make_engine(q4_1, dtype="bfloat16", weight_quantization="auto", deterministic=True)
    assert deterministic.worker.weight_quantization is None
    # other sources: their numbers are not int4's
    q8_0 = _as_converted_from(tiny_model_dirs["llama"], tmp_path, "Q8_0")
    assert make_engine(q8_0, dtype="bfloat16", weight_quantization="auto").worker.weight_quantization is None
    plain = tiny_model_dirs["llama"]
    assert make_engine(plain, dtype="bfloat16", weight_quantization="auto").worker.weight_quantization is None
    # decoder linears of mixed types: no one type to hold
    mixed = _as_converted_from(tiny_model_dirs["llama"], tmp_path, "Q4_1", {"blk.1.ffn_down.weight": "Q6_K"})
    assert make_engine(mixed, dtype="bfloat16", weight_quantization="auto").worker.weight_quantization is None
