"""Deferred catch-up: sequences that do not draft keep their draft entries owed (never fed while
they do not draft); feeding them later, in one packed forward, gives the draft head the same
state as feeding them step by step; past the feature window, the head's context restarts at the
kept features, as if the sequence began there."""

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
        num_tree_slots=2 if drafts else 0,
        params=SamplingParams(),
        prompt_token_ids=tokens,
        output_token_ids=[],
        max_new_tokens=1,
    )


def _run(drafter, request_id, tokens, features, blocks, drafting_steps, trees=False) -> dict[int, torch.Tensor]:
    """Step through the sequence; returns the catch-up output at every step that drafted (with
    `trees`, the drafted tree's token ids instead)."""
    out = {}
    for t in range(len(tokens)):
        work = _work(request_id, tokens, t, blocks, drafts=t in drafting_steps)
        got = drafter.catch_up([work])
        if t in drafting_steps and t > 0:
            root = got[request_id]
            out[t] = root.hidden.clone()
            if trees:
                (tree,) = drafter.build_trees([work], root.hidden[None], (root.top_logprobs[None], root.top_ids[None]))
                out[t] = tree.token_ids.clone()
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


def test_sequences_that_do_not_draft_are_never_fed_and_keep_a_window(drafter, monkeypatch):
    monkeypatch.setattr(drafter, "spec", dataclasses.replace(drafter.spec, feature_window=5))
    feature = drafter.head.feature_size
    tokens = list(range(10, 70))
    for t in range(60):
        assert drafter.catch_up([_work("x", tokens, t, [6, 7, 8, 9], drafts=False)]) == {}
        drafter.record("x", torch.zeros(1, feature))
        state = drafter.states["x"]
        assert 5 <= state.num_pending < 5 + BLOCK or state.pending_start == 0
        assert state.pending_start % BLOCK == 0 and state.pending_start + state.num_pending == t + 1
    assert drafter.states["x"].pending_start == 48
    drafter.drop(["x"])


def test_past_the_window_the_head_restarts_at_the_kept_features(drafter, monkeypatch):
    """Drafting after 39 plain steps with a 5-feature window: the head sees positions 32..38
    only, so it proposes what it would for a sequence that began at position 32 (attention
    with rotary positions depends on relative positions only)."""
    monkeypatch.setattr(drafter, "spec", dataclasses.replace(drafter.spec, feature_window=5))
    g = torch.Generator().manual_seed(1)
    n = 40
    tokens = torch.randint(0, 200, (n,), generator=g).tolist()
    features = torch.randn(n, drafter.head.feature_size, generator=g)  # [n, feature]
    late = _run(drafter, "w", tokens, features, [0, 1, 2], drafting_steps={39})
    fresh = _run(drafter, "f", tokens[32:], features[32:], [3], drafting_steps=set(range(8)))
    torch.testing.assert_close(late[39], fresh[7], rtol=1e-4, atol=1e-4)
    late_tree = _run(drafter, "w", tokens, features, [0, 1, 2], drafting_steps={39}, trees=True)
    fresh_tree = _run(drafter, "f", tokens[32:], features[32:], [3], drafting_steps={7}, trees=True)
    assert torch.equal(late_tree[39], fresh_tree[7])
