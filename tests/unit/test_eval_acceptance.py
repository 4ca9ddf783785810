"""The eval stage's acceptance figures: tau over all prompts, and per category where given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eagle_core.train.evaluate import acceptance, to_markdown


class FakeLLM:
    """Answers each conversation with preset (emitted tokens, steps) and counts drafts."""

    def __init__(self, per_prompt: list[tuple[int, int]]):
        self.per_prompt = per_prompt
        self.engine = SimpleNamespace(spec_counters=SimpleNamespace(num_drafts=0, accepted_per_position=[0, 0]))

    def chat(self, conversations, params, use_tqdm=False):
        counters = self.engine.spec_counters
        outs = []
        for emitted, steps in self.per_prompt[: len(conversations)]:
            counters.num_drafts += steps
            counters.accepted_per_position[0] += emitted - steps  # one accepted draft per extra token
            spec = SimpleNamespace(num_emitted_tokens=emitted, num_steps=steps, mean_acceptance_length=emitted / steps)
            outs.append(SimpleNamespace(spec=spec, token_ids=[0] * emitted))
        return outs


def test_tau_overall_and_by_category():
    llm = FakeLLM([(30, 10), (10, 10), (40, 10)])
    convs = [[{"role": "user", "content": str(i)}] for i in range(3)]
    result = acceptance(llm, convs, 0.0, 96, 0, groups=["writing", "maths", "writing"])
    assert result["tau"] == pytest.approx(80 / 30)
    assert result["tau_by_group"] == pytest.approx({"writing": 70 / 20, "maths": 1.0})
    assert "tau_by_group" not in acceptance(llm, convs, 0.0, 96, 0)
    report = {"head": "h", "tree": {}, "draft_weights": "float32", "results": {"mtbench_T0": result}}
    assert "tau by category, mtbench_T0: writing 3.50, maths 1.00" in to_markdown(report)


def test_groups_must_label_every_prompt():
    llm = FakeLLM([(30, 10), (10, 10)])
    convs = [[{"role": "user", "content": str(i)}] for i in range(2)]
    with pytest.raises(ValueError):
        acceptance(llm, convs, 0.0, 96, 0, groups=["writing"])


def test_eval_tree_is_the_configured_one_or_the_servers_largest():
    from eagle_core.config import SPEC_DEFAULTS
    from eagle_core.train import evaluate
    from eagle_core.train.config import EvalConfig, TrainConfig

    assert evaluate.eval_tree(TrainConfig(eval=EvalConfig(tree=(3, 2, 2), lookup_tokens=0))) == {
        "num_draft_tokens": 3, "depth": 2, "top_k": 2, "lookup_tokens": 0}
    assert evaluate.eval_tree(TrainConfig()) == {
        "num_draft_tokens": 8, "depth": 3, "top_k": 3, "lookup_tokens": SPEC_DEFAULTS.lookup_tokens}


@pytest.mark.parametrize("tree", [(8, 3), (8, 0, 3)])
def test_a_malformed_eval_tree_is_rejected(tree):
    from eagle_core.train.config import EvalConfig

    with pytest.raises(ValueError, match="eval.tree"):
        EvalConfig(tree=tree)
