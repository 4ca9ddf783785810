"""SamplingParams.token_sources: every output says where each new token came from (the head's
tree, context lookup, or the target itself) and where its text ends; asking changes no token."""

from __future__ import annotations

import re

from eagle_core import SamplingParams, SpecConfig
from tests.engine_helpers import make_engine, random_prompts
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import random_head_dir


def _run(engine, prompt: list[int], params: SamplingParams) -> list:
    engine.add_request("r", prompt, params)
    outputs = []
    while engine.has_unfinished():
        outputs += [out for out in engine.step() if out.request_id == "r"]
    return outputs


def _check_ends(engine, outputs) -> str:
    """The ends index the output text: clamped to it (a stop string may cut text an earlier
    step's end counted), non-decreasing, the last at its end, and, where whole characters end,
    the text up to a token's end is its tokens' decoding. Returns the text."""
    text = "".join(out.new_text for out in outputs)
    ids = [t for out in outputs for t in out.new_token_ids]
    sources = [s for out in outputs for s in out.new_token_sources]
    assert all(len(out.new_token_sources) == len(out.new_token_ids) for out in outputs)
    ends = [min(s.text_end, len(text)) for s in sources]
    assert ends == sorted(ends) and sources[-1].text_end == len(text)
    # a stop string cuts its step's ends to the text, which decoding the tokens does not know
    checked = len(ends) - (len(outputs[-1].new_token_ids) if outputs[-1].finish_reason == "stop" else 1)
    for k, end in enumerate(ends[:checked]):
        decoded = engine.tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
        if not decoded.endswith("\ufffd") and sources[k].text_end <= len(text):
            assert text[:end] == decoded
    return text


def test_an_exact_head_gives_head_drafts_then_the_targets_token_per_step(bigram):
    target, oracle = bigram
    engine = make_engine(target, draft=str(oracle), spec=SpecConfig(lookup_tokens=0))
    prompt = random_prompts(3, [9], TINY_VOCAB_SIZE)[0]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outputs = _run(engine, prompt, SamplingParams(**{**vars(params), "token_sources": True}))
    without = _run(engine, prompt, params)
    assert [t for o in outputs for t in o.new_token_ids] == [t for o in without for t in o.new_token_ids]
    assert all(o.new_token_sources is None for o in without)
    text = _check_ends(engine, outputs)
    assert text == "".join(o.new_text for o in without)
    steps = [" ".join(s.source for s in o.new_token_sources) for o in outputs if o.new_token_ids]
    # a step's accepted drafts come first, its own token last (the last step may be cut short)
    assert all(re.fullmatch(r"(head )*target", step) for step in steps[:-1]), steps
    assert sum(step.count("head") for step in steps) > 20  # the oracle's drafts are accepted


def test_lookup_drafts_are_told_apart_from_the_heads(bigram, tmp_path):
    """A random head's drafts fail; the bigram target's greedy text soon cycles, and then
    the context lookup's chain is accepted."""
    target, _ = bigram
    head = random_head_dir(target, tmp_path / "head")
    engine = make_engine(target, draft=str(head), spec=SpecConfig(lookup_tokens=6, lookup_max_batch=0))
    prompt = random_prompts(15, [8], TINY_VOCAB_SIZE)[0]
    outputs = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=80, ignore_eos=True, token_sources=True))
    _check_ends(engine, outputs)
    counts = {}
    for out in outputs:
        for source in out.new_token_sources:
            counts[source.source] = counts.get(source.source, 0) + 1
    assert counts.get("lookup", 0) > 20 and counts.get("head", 0) < counts["lookup"], counts


def test_without_a_draft_head_every_token_is_the_targets(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["llama"])
    prompt = random_prompts(4, [6], TINY_VOCAB_SIZE)[0]
    outputs = _run(engine, prompt, SamplingParams(temperature=0.8, seed=1, max_tokens=12, ignore_eos=True, token_sources=True))
    _check_ends(engine, outputs)
    assert {s.source for o in outputs for s in o.new_token_sources} == {"target"}


def test_a_stop_string_cuts_the_sources_with_the_text(bigram):
    target, oracle = bigram
    engine = make_engine(target, draft=str(oracle), spec=SpecConfig(lookup_tokens=0))
    prompt = random_prompts(3, [9], TINY_VOCAB_SIZE)[0]
    full = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, token_sources=True))
    text = "".join(o.new_text for o in full)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = _run(engine, prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop], token_sources=True))
    cut_text = _check_ends(engine, cut)
    assert cut_text == text[: text.index(stop)]
    assert cut[-1].finish_reason == "stop"
