"""--weight-packing auto on an AMX CPU: the engine's linears run on packed weights and every
token is the one it computes without them, plain and speculative, alone and in a batch."""

from __future__ import annotations

import pytest
import torch

from eagle_core import SamplingParams, SpecConfig
from eagle_core.spec.int8_linear import Int8Linear
from eagle_core.worker.packed_linear import PackedLinear
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.integration.test_smollm2 import QUESTIONS, chat_prompts
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import random_head_dir
from tests.unit.test_packed_linear import needs_amx

pytestmark = needs_amx

TREE = SpecConfig(num_draft_tokens=8, depth=3, top_k=3, lookup_tokens=4)


def _packed(module: torch.nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if isinstance(m, PackedLinear)]


def test_the_target_and_draft_linears_are_packed_and_decode_the_same_tokens(tiny_model_dirs, tmp_path):
    model_dir = tiny_model_dirs["llama"]
    head = random_head_dir(model_dir, tmp_path / "head")
    # Prompts past 32 tokens prefill on torch's linear; decode and tree steps on the packed one.
    prompts = random_prompts(21, [3, 9, 17, 40, 70, 5], TINY_VOCAB_SIZE)
    # Seeded sampling too: packing also moves the int8 draft kernel's row limit (16 -> 4), so the
    # drafts of 5-16-row inputs change; a seeded request's text must not.
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, seed=5, max_tokens=24, ignore_eos=True)
    runs = {}
    for packing in ("auto", "none"):
        plain = make_engine(model_dir, dtype="bfloat16", weight_packing=packing, max_num_seqs=4)
        spec = make_engine(model_dir, draft=str(head), spec=TREE, dtype="bfloat16", weight_packing=packing,
                           max_num_seqs=4)
        runs[packing] = [run_staggered(engine, prompts, params, first=3)
                         for engine in (plain, spec) for params in (greedy, sampled)]
        assert plain.worker.packed_weights is spec.worker.packed_weights is (packing == "auto")
        if packing == "auto":
            target_linears = _packed(plain.worker.target.model)
            # 7 per layer (q, k, v, o, gate, up, down) and the LM head
            assert len(target_linears) == 7 * plain.worker.target.config.num_hidden_layers + 1
            draft = spec.worker.draft_head
            assert isinstance(draft.fc, PackedLinear)  # left bf16 by int8: packed instead
            down = draft.layers[0].mlp.down_proj
            assert isinstance(down, Int8Linear) and isinstance(down.linear, PackedLinear)
            assert down.row_limit == 4
        else:
            assert _packed(plain.worker.target.model) == _packed(spec.worker.draft_head) == []
    assert runs["auto"] == runs["none"]
    assert runs["auto"][0] != runs["auto"][1]  # the sampled run is not the greedy one
    assert spec.spec_counters.num_drafts > 0


@pytest.mark.slow
def test_smollm2_gives_the_same_tokens_with_packed_weights(smollm2_dir):
    """The real model in bf16 (the CPU default where AMX exists), greedy, in a batch."""
    prompts = chat_prompts(smollm2_dir, QUESTIONS[:6])
    params = SamplingParams(temperature=0, max_tokens=32)
    outputs = {}
    for packing in ("auto", "none"):
        engine = make_engine(smollm2_dir, dtype="bfloat16", max_model_len=1024, weight_packing=packing, max_num_seqs=6)
        outputs[packing] = run_staggered(engine, prompts, params, first=3)
        assert engine.worker.packed_weights is (packing == "auto")  # the start-up check passed
    assert outputs["auto"] == outputs["none"]
