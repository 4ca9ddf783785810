"""EAGLE speculative decoding in the engine: lossless greedy and sampling, real acceptance."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from eagle_core import SamplingParams, SpecConfig
from eagle_core.errors import InvalidRequestError, ModelLoadError
from eagle_core.spec.drafter import Drafter
from eagle_core.spec.int8_linear import Int8Linear
from eagle_core.spec.lookup import ContextLookup
from tests.engine_helpers import hf_greedy, make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import (
    PENALISED,
    chi_square_pvalue,
    exact_first_three,
    first_three_counts,
    random_head_dir,
)

TREES = {
    "tree": SpecConfig(num_draft_tokens=12, depth=4, top_k=3),
    "chain": SpecConfig(num_draft_tokens=5, depth=4, top_k=1),
}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("tree", sorted(TREES))
def test_greedy_with_a_random_head_equals_plain_decoding(tiny_model_dirs, tmp_path, arch, tree):
    model_dir = tiny_model_dirs[arch]
    head = random_head_dir(model_dir, tmp_path / "head")
    prompts = random_prompts(11, [3 + 7 * i for i in range(20)], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=20)
    plain = run_staggered(make_engine(model_dir, max_num_seqs=8), prompts, params, first=8)
    spec_engine = make_engine(model_dir, draft=str(head), spec=TREES[tree], max_num_seqs=8)
    spec = run_staggered(spec_engine, prompts, params, first=8)
    assert spec == plain


def test_int8_draft_weights_on_a_bf16_model(tiny_model_dirs, tmp_path):
    """auto gives a bf16 model's draft head int8 weights (fc aside); the engine decodes with it."""
    model_dir = tiny_model_dirs["llama"]
    head = random_head_dir(model_dir, tmp_path / "head")
    spec = SpecConfig(num_draft_tokens=8, depth=3, top_k=3)
    engine = make_engine(model_dir, draft=str(head), spec=spec, dtype="bfloat16")
    layer = engine.worker.draft_head.layers[0]
    assert isinstance(layer.mlp.down_proj, Int8Linear) and isinstance(layer.self_attn.q_proj, Int8Linear)
    assert not isinstance(engine.worker.draft_head.fc, Int8Linear)  # bf16 (packed on AMX CPUs)
    assert engine.worker.draft_weights == "int8"
    prompts = random_prompts(13, [3, 8, 17, 30], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs = run_staggered(engine, prompts, params)
    assert sorted(len(tokens) for tokens in outputs.values()) == [16] * 4
    assert engine.spec_counters.num_drafts > 0


@pytest.mark.parametrize(("quantization", "expected"), [("auto", "float32"), ("none", "float32")])
def test_float32_models_keep_their_draft_weights(tiny_model_dirs, tmp_path, quantization, expected):
    model_dir = tiny_model_dirs["llama"]
    head = random_head_dir(model_dir, tmp_path / "head")
    engine = make_engine(model_dir, draft=str(head), spec=SpecConfig(draft_quantization=quantization))
    assert engine.worker.draft_weights == expected
    assert type(engine.worker.draft_head.layers[0].mlp.down_proj) is torch.nn.Linear


def test_int8_draft_weights_where_they_cannot_run_are_refused(tiny_model_dirs, tmp_path):
    model_dir = tiny_model_dirs["llama"]
    head = random_head_dir(model_dir, tmp_path / "head")
    with pytest.raises(ModelLoadError, match="int8 needs a bfloat16 model on the CPU"):
        make_engine(model_dir, draft=str(head), spec=SpecConfig(draft_quantization="int8"))


def test_unknown_draft_quantization_is_refused():
    with pytest.raises(ValueError, match="draft_quantization must be one of auto, int8, none"):
        SpecConfig(draft_quantization="int4")


@pytest.mark.parametrize(
    ("spec", "min_tau"),
    [
        # A chain of 5 drafts is accepted whole: 6 tokens per step until the length cap.
        (SpecConfig(num_draft_tokens=6, depth=5, top_k=1), 4.5),
        # A tree of 8 nodes over flat random-model distributions is bushy, so shallower.
        (SpecConfig(num_draft_tokens=8, depth=5, top_k=2), 2.0),
    ],
)
def test_oracle_head_is_accepted_deep_and_stays_exact(bigram, spec, min_tau):
    target, oracle = bigram
    prompts = random_prompts(12, [4, 9, 15, 30, 2, 7, 12, 20], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = run_staggered(make_engine(target), prompts, params)
    engine = make_engine(target, draft=str(oracle), spec=spec)
    outputs = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                assert out.spec.mean_acceptance_length > min_tau, out.spec
    assert outputs == plain
    stats = engine.stats
    assert 0 < stats["spec_num_accepted_tokens"] <= stats["spec_num_draft_tokens"]
    per_position = stats["spec_accepted_per_position"]
    assert sum(per_position) == stats["spec_num_accepted_tokens"]
    assert per_position == sorted(per_position, reverse=True)  # depth k+1 needs depth k
    assert per_position[0] <= stats["spec_num_drafts"]


def test_seeded_sampling_with_penalties_is_identical_with_and_without_speculation(bigram, tmp_path):
    """Each emitted token is the draw of its output position from the same request key in both
    modes, and the penalised distribution at a tree node uses that node's own history: same
    seed, same text."""
    target, oracle = bigram
    prompts = random_prompts(13, [5, 11, 17, 23], TINY_VOCAB_SIZE)
    params = PENALISED
    plain = run_staggered(make_engine(target), prompts, params)
    spec = run_staggered(make_engine(target, draft=str(oracle)), prompts, params)
    assert spec == plain


def test_logit_bias_under_speculation_matches_plain_decoding(bigram):
    """The bias applies at every tree node (the target's biased distribution verifies each
    draft): greedy and seeded text equal plain decoding's, a +100 token is all that comes out."""
    target, oracle = bigram
    prompts = random_prompts(14, [5, 11, 17], TINY_VOCAB_SIZE)
    bias = {3: -100, 7: 4.0, 11: 2.5}
    for params in (
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logit_bias=bias),
        SamplingParams(temperature=0.8, seed=5, max_tokens=24, ignore_eos=True, logit_bias=bias),
    ):
        plain = run_staggered(make_engine(target), prompts, params)
        spec = run_staggered(make_engine(target, draft=str(oracle)), prompts, params)
        assert spec == plain
        assert all(3 not in tokens for tokens in plain.values())
    unbiased = run_staggered(make_engine(target), prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert unbiased != run_staggered(make_engine(target), prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logit_bias=bias))
    forced = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias={9: 100})
    assert run_staggered(make_engine(target, draft=str(oracle)), prompts, forced) == {str(i): [9] * 6 for i in range(3)}


def test_logit_bias_outside_the_vocabulary_is_refused(bigram):
    engine = make_engine(bigram[0])
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("r", [1, 2, 3], SamplingParams(logit_bias={TINY_VOCAB_SIZE: 1}))
    assert err.value.param == "logit_bias"


def _finish(engine, prompt, params) -> dict:
    """One request to its end: tokens, text, finish reason, logprob entries, usage."""
    engine.add_request("r", prompt, params)
    done = {"tokens": [], "text": "", "logprobs": 0}
    while engine.has_unfinished():
        for out in engine.step():
            done["tokens"] += out.new_token_ids
            done["text"] += out.new_text
            done["logprobs"] += len(out.new_logprobs or [])
            if out.finished:
                done["reason"], done["usage"] = out.finish_reason, out.num_output_tokens
    return done


def test_stop_strings_and_min_tokens_under_deep_speculation_match_plain_decoding(bigram):
    """Steps here accept up to 6 tokens, so a stop string often completes inside one. The output
    tokens (and usage, logprobs) still end with the token that completed it, as plain decoding's
    do; a stop string completed by the last token max_tokens allows finishes as "stop"; and
    min_tokens holds back stop strings and stop ids identically in both modes."""
    target, oracle = bigram
    plain = make_engine(target)
    spec = make_engine(target, draft=str(oracle), spec=SpecConfig(num_draft_tokens=6, depth=5, top_k=1))
    decode = plain.tokenizer.decode
    base = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=0)
    for prompt in random_prompts(16, [4, 9, 15], TINY_VOCAB_SIZE):
        free = _finish(plain, prompt, base)
        # three letters from the middle (random tokens also decode to partial characters)
        start = next(i for i in range(10, len(free["text"])) if free["text"][i : i + 3].isalpha())
        stop = free["text"][start : start + 3]
        cut = free["text"].find(stop)

        def both(prompt=prompt, **changes) -> dict:
            params = dataclasses.replace(base, **changes)
            result = _finish(plain, prompt, params)
            assert _finish(spec, prompt, params) == result, changes
            return result

        stopped = both(stop=(stop,))
        tokens = stopped["tokens"]
        assert stopped["reason"] == "stop" and stopped["text"] == free["text"][:cut]
        assert stopped["usage"] == stopped["logprobs"] == len(tokens) < len(free["tokens"])
        assert stop in decode(tokens) and stop not in decode(tokens[:-1])
        assert both(stop=(stop,), max_tokens=len(tokens))["reason"] == "stop"
        # min_tokens past the first stop: searched only in text that ends after it
        later = both(stop=(stop,), min_tokens=len(tokens) + 1)
        assert len(later["tokens"]) > len(tokens) and later["text"].startswith(free["text"][: cut + len(stop)])
        # a stop id can only be sampled from the min_tokens-th token on
        stop_id = free["tokens"][3]
        held = both(stop_token_ids=(stop_id,), min_tokens=12, max_tokens=30)
        assert stop_id not in held["tokens"] and len(held["tokens"]) >= 12
    assert spec.stats["spec_num_accepted_tokens"] > 2 * spec.stats["spec_num_drafts"]


def test_sampling_under_speculation_matches_the_target_distribution(bigram, monkeypatch):
    target, oracle = bigram
    prompt = random_prompts(14, [6], TINY_VOCAB_SIZE)[0]
    top_k, num_samples = 3, 1500
    params = dict(temperature=1.0, top_k=top_k, max_tokens=3, ignore_eos=True)
    exact = exact_first_three(target, prompt, top_k)
    spec = SpecConfig(num_draft_tokens=8, depth=3, top_k=2)
    engine = make_engine(target, draft=str(oracle), spec=spec, max_num_seqs=64)
    counts = first_three_counts(engine, prompt, params, num_samples)
    assert chi_square_pvalue(counts, exact, num_samples) > 1e-3

    # The same check must fail for a verifier that accepts every draft along the first
    # children (instead of drawing from the target at each node): it over-produces the draft's
    # choices.
    def accept_first_children(tree, drawn):
        last = tree.depths.argmax(dim=1)  # the deepest node, the first among equally deep ones
        batch = torch.arange(tree.batch_size)
        return last, tree.ancestor_mask[batch, last]

    from eagle_core.worker import spec_runner

    monkeypatch.setattr(spec_runner, "accepted_path", accept_first_children)
    biased_engine = make_engine(target, draft=str(oracle), spec=spec, max_num_seqs=64)
    biased_counts = first_three_counts(biased_engine, prompt, params, num_samples)
    assert chi_square_pvalue(biased_counts, exact, num_samples) < 1e-6


def _tau(engine) -> float:
    stats = engine.stats
    return 1 + stats["spec_num_accepted_tokens"] / stats["spec_num_drafts"]


def test_context_lookup_drafts_a_looping_target_and_stays_exact(bigram, tmp_path, monkeypatch):
    """The bigram target's greedy text soon cycles; once it does, the lookup chain predicts it
    while the random head's drafts stay wrong. Output equals plain decoding either way, also
    above --spec-max-batch, where the chain alone is the tree."""
    target, _ = bigram
    head = random_head_dir(target, tmp_path / "head")
    prompts = random_prompts(15, [3, 8, 13, 21], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
    plain = run_staggered(make_engine(target), prompts, params)
    head_trees = []  # sequences the head drafted a tree for, per step
    build_trees = Drafter.build_trees
    monkeypatch.setattr(Drafter, "build_trees", lambda self, works, h, top: head_trees.append(len(works)) or build_trees(self, works, h, top))
    taus = {}
    for lookup, max_batch in ((0, 0), (6, 0), (6, 1)):
        head_trees.clear()
        spec = SpecConfig(lookup_tokens=lookup, lookup_max_batch=0)  # lookup alone at any batch size
        engine = make_engine(target, draft=str(head), spec=spec, spec_max_batch=max_batch)
        assert run_staggered(engine, prompts, params) == plain
        taus[lookup, max_batch] = _tau(engine)
        stats = engine.stats
        engine.step()  # hands the worker the last finished request ids
        assert engine.worker.runner.lookup.indexes == {}  # finished requests' indexes dropped
        if max_batch == 0:  # every decode step has a head tree, lookup nodes on top of its 7
            assert stats["spec_num_drafts"] == sum(head_trees)
            assert (stats["spec_num_draft_tokens"] > 7 * stats["spec_num_drafts"]) == bool(lookup)
        else:  # the head drafts only once one sequence is left; before, lookup-only trees
            assert stats["spec_num_drafts"] > 1.5 * sum(head_trees)  # measured 60 against 20
            assert stats["spec_fallbacks"]["batch_size"] > 0  # steps where no chain matched
    # measured 1.00, 2.20 and 4.13 (without a head tree, a step without a chain is no draft)
    assert taus[0, 0] < 1.2 and taus[6, 0] > 1.8 and taus[6, 1] > 1.8, taus


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("spec_max_batch", [0, 2])
def test_lookup_chains_grafted_onto_the_tree_decode_exactly(tiny_model_dirs, tmp_path, monkeypatch, arch, spec_max_batch):
    """Real attention this time (the bigram target ignores positions and masks): an oracle in
    place of the n-gram index proposes the plain continuation, cut wrong after 0-3 tokens, so
    grafted nodes are accepted at varying depths next to the random head's rejected ones (with
    spec_max_batch 2, the chains alone are the trees until two of the five requests remain)."""
    model_dir = tiny_model_dirs[arch]
    head = random_head_dir(model_dir, tmp_path / "head")
    prompts = random_prompts(16, [3, 8, 13, 21, 30], TINY_VOCAB_SIZE)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = run_staggered(make_engine(model_dir), prompts, params)

    def oracle_chain(self, request_id, prompt, output):
        done = len(output)
        chain = list(plain[request_id][done : done + self.max_tokens])
        wrong_at = done % 4
        if wrong_at < len(chain):
            chain[wrong_at] = (chain[wrong_at] + 1) % TINY_VOCAB_SIZE
        return chain

    monkeypatch.setattr(ContextLookup, "chain", oracle_chain)
    spec = SpecConfig(lookup_tokens=5, lookup_max_batch=0)
    engine = make_engine(model_dir, draft=str(head), spec=spec, spec_max_batch=spec_max_batch)
    assert run_staggered(engine, prompts, params) == plain
    assert _tau(engine) > 2.0  # the cut chains alone would give ~2.5
    assert max(i for i, n in enumerate(engine.stats["spec_accepted_per_position"]) if n) == 2  # depth 3


def test_sampling_with_context_lookup_matches_the_target_distribution(bigram, tmp_path):
    """Lookup chains are deterministic drafts like the head's: sampling must stay exact. The
    prompt holds the target's own greedy text twice, so lookup proposes its likely path; the
    head's tree is the root alone, so every draft token is a lookup one. (The bigram target
    ignores positions and masks: the graft's tree structure is checked by the greedy test
    above under real attention.)"""
    target, _ = bigram
    head = random_head_dir(target, tmp_path / "head")
    greedy = [5, *hf_greedy(target, [5], 13, eos_ids=set())]  # the target's greedy text from token 5
    prompt = greedy[:14] + greedy[:6]  # ends in greedy[5]; greedy[5:7] occurred earlier
    top_k, num_samples = 3, 1500
    # 5 tokens, of which the first three are compared: the second step has room for 3 drafts
    params = dict(temperature=1.0, top_k=top_k, max_tokens=5, ignore_eos=True)
    exact = exact_first_three(target, prompt, top_k)
    spec = SpecConfig(num_draft_tokens=1, depth=1, top_k=1, lookup_tokens=4)
    engine = make_engine(target, draft=str(head), spec=spec, max_num_seqs=64)
    counts = first_three_counts(engine, prompt, params, num_samples)
    stats = engine.stats
    assert stats["spec_num_draft_tokens"] > stats["spec_num_accepted_tokens"] > 0.2 * num_samples
    assert chi_square_pvalue(counts, exact, num_samples) > 1e-3


@pytest.mark.parametrize("prompt_len", [1, 2, 5])
def test_a_prompts_last_token_is_prefill_not_a_speculative_step(bigram, prompt_len):
    """The first token comes from prefill, even when the prompt's last token is computed alone
    (a 1-token prompt): spec_decode's steps and emitted tokens count only the tokens after it."""
    target, oracle = bigram
    engine = make_engine(target, draft=str(oracle), spec=SpecConfig(num_draft_tokens=5, depth=4, top_k=1))
    prompt = random_prompts(prompt_len, [prompt_len], TINY_VOCAB_SIZE)[0]
    for max_tokens in (1, 9):
        engine.add_request(f"{max_tokens}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    assert out.num_output_tokens == max_tokens
                    assert out.spec.num_emitted_tokens == max_tokens - 1, out.spec
                    assert (out.spec.num_steps == 0) == (max_tokens == 1), out.spec
