"""--deterministic: a seeded request gets the same tokens, and the same logprobs bit for bit,
alone and beside other streams, with and without speculation, in bf16.

The model is a tiny Llama made wide where it matters (hidden 576 like SmolLM2, MLP 4096): on the
2-core Xeon, torch's bf16 GEMM for a 4096 x 576 weight gives one row alone a result different
in the last bits from the same row among 4 or more, so without the mode this model's logprobs
(and soon its tokens) change with the batch. The usual tiny test models (hidden 64) are too
small for any kernel to change with the row count, and pass either way.
"""

from __future__ import annotations

import pytest

from eagle_core import SamplingParams, SpecConfig
from tests.engine_helpers import make_engine, random_prompts
from tests.models import TINY_VOCAB_SIZE, make_tiny_model_dir
from tests.spec_helpers import random_head_dir

WIDE = dict(hidden_size=576, intermediate_size=4096, num_attention_heads=9, num_key_value_heads=3, initializer_range=0.05)
SEEDED = SamplingParams(temperature=0.8, seed=1234, max_tokens=40, ignore_eos=True, logprobs=3)
OTHERS = [3, 30, 7, 15, 60, 100]
"""Prompt lengths of the other streams: 3 of them, then all 6."""


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    return make_tiny_model_dir("llama", tmp_path_factory.mktemp("wide") / "llama", **WIDE)


def run(engine, prompt: list[int], others: list[list[int]]) -> tuple[list[int], list]:
    """The seeded request's tokens and logprob entries, with `others` (T=0.8, seeds of their
    own) submitted first and decoding while it prefills."""
    for i, other in enumerate(others):
        engine.add_request(f"o{i}", other, SamplingParams(temperature=0.8, seed=i, max_tokens=60, ignore_eos=True))
    for _ in range(2 if others else 0):
        engine.step()
    engine.add_request("a", prompt, SEEDED)
    tokens, logprobs = [], []
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == "a":
                tokens += out.new_token_ids
                logprobs += [(lp.token_id, lp.logprob, tuple(lp.top)) for lp in out.new_logprobs or []]
    return tokens, logprobs


def test_seeded_sampling_is_batch_invariant_in_bf16_with_and_without_speculation(wide_dir, tmp_path):
    prompt = random_prompts(5, [12], TINY_VOCAB_SIZE)[0]
    others = random_prompts(6, OTHERS, TINY_VOCAB_SIZE)
    plain = make_engine(wide_dir, dtype="bfloat16", deterministic=True)
    alone = run(plain, prompt, [])
    assert len(alone[0]) == len(alone[1]) == SEEDED.max_tokens
    for count in (3, 6):
        assert run(plain, prompt, others[:count]) == alone, f"plain decoding beside {count} streams"
    head = random_head_dir(wide_dir, tmp_path / "head")
    spec = make_engine(
        wide_dir, dtype="bfloat16", deterministic=True, draft=str(head),
        spec=SpecConfig(num_draft_tokens=8, depth=3, top_k=3),
    )
    assert run(spec, prompt, []) == alone, "speculation alone"
    assert run(spec, prompt, others[:6]) == alone, "speculation beside 6 streams"
    assert spec.stats["spec_num_accepted_tokens"] > 0, "no tree node was accepted: the tree path went untested"
