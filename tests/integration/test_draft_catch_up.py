"""Deferred catch-up: sequences that do not draft this step keep their draft entries owed, and
feeding them later, in one packed forward, gives the draft head the same state as feeding them
step by step."""

import dataclasses

import pytest
import torch

from eagle_core import SamplingParams
from eagle_core.batch import SeqWork
from tests.engine_helpers import make_engine
from tests.spec_helpers import random_head_dir

BLOCK = 16


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, tiny_llama_dir):
    head = random_head_dir(tiny_llama_dir, tmp_path_factory.mktemp("head") / "head")
    engine = make_engine(tiny_llama_dir, draft=str(head), max_num_seqs=4)
    return engine.worker.runner.drafter


def _work(request_id: str, tokens: list[int], t: int, blocks: list[int], drafts: bool) -> SeqWork:
    """Decode step at position t (t tokens already in the target's KV, tokens[t] is the root)."""
    return SeqWork(
        request_id=request_id,
        token_ids=[tokens[t]],
        start_pos=t,
        block_table=blocks,
        sample=True,
        num_draft_slots=2 if drafts else 0,
        params=SamplingParams(),
        prompt_token_ids=tokens,
        output_token_ids=[],
        max_new_tokens=1,
    )


def _run(drafter, request_id, tokens, features, blocks, drafting_steps) -> dict[int, torch.Tensor]:
    """Step through the sequence; returns the catch-up output at every step that drafted."""
    out = {}
    for t in range(len(tokens)):
        work = _work(request_id, tokens, t, blocks, drafts=t in drafting_steps)
        got = drafter.catch_up([work])
        if t in drafting_steps and t > 0:
            out[t] = got[request_id].hidden.clone()
        else:
            assert request_id not in got  # not drafting: nothing fed, entries stay owed
        drafter.record(request_id, features[t : t + 1])  # the target committed tokens[t]
    drafter.drop([request_id])
    return out


def test_deferred_catch_up_equals_step_by_step(drafter):
    g = torch.Generator().manual_seed(0)
    n = 40
    tokens = torch.randint(0, 200, (n,), generator=g).tolist()
    feature = drafter.head.feature_size
    features = torch.randn(n, feature, generator=g)  # [n, feature]
    blocks = [0, 1, 2]  # 48 positions
    every = _run(drafter, "a", tokens, features, blocks, drafting_steps=set(range(n)))
    # Plain decoding for 30 steps (as above --spec-max-batch), then drafting resumes.
    deferred = _run(drafter, "b", tokens, features, [3, 4, 5], drafting_steps={30, 35, 39})
    for t, hidden in deferred.items():
        torch.testing.assert_close(hidden, every[t], rtol=1e-4, atol=1e-4)
    assert len(deferred) == 3


def test_any_sequence_owing_the_limit_flushes_every_sequence(drafter, monkeypatch):
    monkeypatch.setattr(drafter, "spec", dataclasses.replace(drafter.spec, defer_limit=5))
    feature = drafter.head.feature_size
    tokens = list(range(10, 30))
    fed: list[set[str]] = []
    for t in range(8):
        works = [_work("x", tokens, t, [6, 7], drafts=False)]
        if t >= 2:  # "y" starts two steps later, so the two owe different amounts
            works.append(_work("y", tokens, t - 2, [8, 9], drafts=False))
        fed.append(set(drafter.catch_up(works)))
        for work in works:
            drafter.record(work.request_id, torch.zeros(1, feature))
    drafter.drop(["x", "y"])
    # "x" owes 5 entries at step 5, so both are fed there (y owing 3); then they owe afresh.
    assert fed == [set(), set(), set(), set(), set(), {"x", "y"}, set(), set()]
