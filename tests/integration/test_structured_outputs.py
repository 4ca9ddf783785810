"""Structured outputs in the engine: grammar-constrained text identical with and without
speculation, and sampled under speculation from exactly the constrained distribution."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eagle_core import SamplingParams, SpecConfig
from eagle_core.errors import InvalidRequestError
from eagle_core.grammar import GrammarCompiler, GrammarMasks
from eagle_core.sampling_params import Grammar
from tests.engine_helpers import make_engine, random_prompts, run_staggered
from tests.models import TINY_VOCAB_SIZE
from tests.spec_helpers import chi_square_pvalue, first_three_counts

RECORD = Grammar(
    "json_schema",
    json.dumps({
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tag": {"enum": ["on", "off"]}, "xs": {"type": "array", "items": {"type": "number"}}},
        "required": ["n", "tag", "xs"],
        "additionalProperties": False,
    }),
)


@pytest.mark.parametrize("grammar", [RECORD, Grammar("json_object")], ids=["schema", "object"])
def test_constrained_text_is_identical_with_and_without_speculation(bigram, grammar):
    """Greedy and seeded sampling, with penalties: the grammar's mask at every tree node is the
    mask of that node's own path, so each emitted token is plain decoding's, whether trees are
    verified as drafted or pruned by the grammar and extended by its forced tokens. Pruning
    verifies fewer draft tokens and accepts more of them."""
    target, oracle = bigram
    prompts = random_prompts(21, [5, 11, 17, 8], TINY_VOCAB_SIZE)
    tokenizer = AutoTokenizer.from_pretrained(target)
    compiler = GrammarCompiler(tokenizer, TINY_VOCAB_SIZE)
    for params in (
        SamplingParams(temperature=0, max_tokens=30, grammar=grammar),
        SamplingParams(temperature=1.0, seed=3, max_tokens=30, grammar=grammar, presence_penalty=0.4),
        SamplingParams(temperature=0.7, seed=4, max_tokens=30, grammar=grammar, stop=('",',), logprobs=2),
    ):
        plain = run_staggered(make_engine(target), prompts, params)
        rates = {}
        for drafting in (True, False):
            engine = make_engine(target, draft=str(oracle), spec=SpecConfig(grammar_drafting=drafting))
            assert run_staggered(engine, prompts, params) == plain, drafting
            stats = engine.stats
            rates[drafting] = stats["spec_num_accepted_tokens"] / stats["spec_num_draft_tokens"]
        assert rates[True] > rates[False]
        for tokens in plain.values():  # every output is a prefix the grammar accepts
            matcher = compiler.matcher(grammar)
            body = tokens[:-1] if tokens[-1] == tokenizer.eos_token_id else tokens
            assert matcher.validate_tokens(body) == len(body)
            if len(body) < len(tokens):
                assert matcher.consume_tokens(body) and matcher.is_accepting()


def _exact_constrained(target_dir, prompt, grammar: Grammar, top_k: int) -> dict[tuple[int, ...], float]:
    """The exact distribution of the first three tokens (fewer where a stop token ends the
    output; it is not part of it): the target's logits at each prefix, masked by the grammar
    after the output so far, then top-k at T=1."""
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    compiler = GrammarCompiler(tokenizer, TINY_VOCAB_SIZE)
    stop = frozenset({tokenizer.eos_token_id})

    def step(output):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + output])).logits[0, -1]
        allowed = GrammarMasks(compiler).allowed(["x"], [grammar], [output], [stop])[0]
        top = torch.topk(logits.masked_fill(~allowed, float("-inf")), top_k)
        probs = torch.softmax(top.values, dim=-1)
        return [(t, p) for t, p in zip(top.indices.tolist(), probs.tolist()) if p > 0]

    exact: dict[tuple[int, ...], float] = {}

    def expand(output: list[int], prob: float) -> None:
        if len(output) == 3 or (output and output[-1] in stop):
            key = tuple(output[:-1] if output[-1] in stop else output)  # outputs end before a stop token
            exact[key] = exact.get(key, 0.0) + prob
            return
        for token, p in step(output):
            expand(output + [token], prob * p)

    expand([], 1.0)
    return exact


SHORT = Grammar("regex", "(.|\\n){0,7}")
"""At most 7 characters: what a position allows depends on the characters of the path before
it, and the bigram target's likely tokens (2-3 characters) fit, so drafts are accepted."""


def test_sampling_under_a_grammar_and_speculation_matches_the_constrained_distribution(bigram, monkeypatch):
    """T=1 draws through draft trees follow the constrained target distribution; a mask taken
    at the root for every tree node (ignoring the path below it) is caught."""
    target, oracle = bigram
    prompt = random_prompts(22, [6], TINY_VOCAB_SIZE)[0]
    top_k, num_samples = 3, 1200
    spec = SpecConfig(num_draft_tokens=8, depth=3, top_k=2)
    engine = make_engine(target, draft=str(oracle), spec=spec, max_num_seqs=64)
    params = dict(temperature=1.0, top_k=top_k, max_tokens=3, grammar=SHORT)
    exact = _exact_constrained(target, prompt, SHORT, top_k)
    counts = first_three_counts(engine, prompt, params, num_samples)
    assert engine.stats["spec_num_accepted_tokens"] > num_samples / 8  # trees decided many tokens
    assert chi_square_pvalue(counts, exact, num_samples) > 1e-3

    original = GrammarMasks.allowed

    def root_mask_everywhere(self, request_ids, grammars, histories, stop_token_ids):
        roots = {}
        for request_id, history in zip(request_ids, histories):
            roots.setdefault(request_id, history)  # a step's first row of a request is its root
        return original(self, request_ids, grammars, [roots[r] for r in request_ids], stop_token_ids)

    monkeypatch.setattr(GrammarMasks, "allowed", root_mask_everywhere)
    wrong_engine = make_engine(target, draft=str(oracle), spec=spec, max_num_seqs=64)
    wrong = first_three_counts(wrong_engine, prompt, params, num_samples)
    outside = sum(n for key, n in wrong.items() if key not in exact)
    assert outside > 0 or chi_square_pvalue(wrong, exact, num_samples) < 1e-6


def test_grammars_the_engine_cannot_use_are_refused(bigram):
    engine = make_engine(bigram[0])
    bad = Grammar("json_schema", json.dumps({"type": "object", "required": 5}))
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("r", [1, 2, 3], SamplingParams(grammar=bad))
    assert err.value.param == "response_format"
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("r", [1, 2, 3], SamplingParams(grammar=Grammar("json_object"), ignore_eos=True))
    assert err.value.param == "ignore_eos"
