"""Grammar masks (eagle_core/grammar.py) on the tiny byte-level tokenizer: packed masks, masks
at draft-tree histories equal to a fresh matcher's, unreachable rows, stop tokens, errors."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_core import sampling
from eagle_core.errors import InvalidRequestError
from eagle_core.grammar import GrammarCompiler, GrammarMasks, unpack_bitmask
from eagle_core.sampling_params import Grammar, SamplingParams
from tests.models import make_tiny_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string", "enum": ["xy", "z"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer))


def _fresh_allowed(compiler: GrammarCompiler, grammar: Grammar, history: list[int], stop: frozenset[int]) -> torch.Tensor:
    """[vocab] bool: what a brand-new matcher allows after `history`."""
    return GrammarMasks(compiler).allowed(["fresh"], [grammar], [history], [stop])[0]


def test_unpack_bitmask_reads_bit_j_of_word_w_as_token_32w_plus_j():
    bitmask = torch.tensor([[0b101, 0], [0, -1]], dtype=torch.int32)  # [2, 2]
    allowed = unpack_bitmask(bitmask, 40)
    assert allowed.shape == (2, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2]
    assert allowed[1].nonzero().flatten().tolist() == list(range(32, 40))


def test_masks_along_tree_paths_equal_a_fresh_matchers(compiler, tokenizer):
    """Rows in a step's order (root, then nodes whose histories branch and share prefixes) get
    the mask of their own history, whatever state the previous row left the matcher in."""
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    text = '{"a": 12, "b": "xy"}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    other = tokenizer.encode('{"a": 7', add_special_tokens=False)
    histories = [ids[:2], ids[:3], ids[:4], other, ids[:3], ids, ids[:1], []]
    masks = GrammarMasks(compiler)
    stop = frozenset({tokenizer.eos_token_id})
    allowed = masks.allowed(["r"] * len(histories), [grammar] * len(histories), histories, [stop] * len(histories))
    for row, history in enumerate(histories):
        expected = _fresh_allowed(compiler, grammar, history, stop)
        assert torch.equal(allowed[row], expected), (row, history)
    # the complete document allows nothing but the stop token
    assert allowed[histories.index(ids)].nonzero().flatten().tolist() == [tokenizer.eos_token_id]
    # an unfinished one does not allow it
    assert not allowed[0, tokenizer.eos_token_id]


def test_rows_the_grammar_cannot_reach_allow_every_token(compiler, tokenizer):
    """A node below a token the grammar forbids, or below a stop token, is never accepted; its
    row must still be a distribution (no row of -inf only)."""
    grammar = Grammar("json_object")
    bad = tokenizer.encode("hello", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    good = tokenizer.encode("{}", add_special_tokens=False)
    rows = [[], bad, good + [eos]]
    allowed = GrammarMasks(compiler).allowed(["r"] * 3, [grammar] * 3, rows, [frozenset({eos})] * 3)
    assert not allowed[0].all() and allowed[0].any()
    assert allowed[1].all() and allowed[2].all()


def test_rows_without_a_grammar_are_unconstrained_and_none_when_nobody_has_one(compiler):
    masks = GrammarMasks(compiler)
    assert masks.allowed(["a"], [None], [[]], [frozenset()]) is None
    allowed = masks.allowed(["a", "b"], [None, Grammar("json_object")], [[], []], [frozenset()] * 2)
    assert allowed[0].all() and not allowed[1].all()


def test_a_grammar_wins_over_min_tokens_when_only_a_stop_token_is_left():
    logits = torch.zeros(2, 5)
    allowed = torch.tensor([[False, True, True, False, False], [False, False, False, False, True]])
    held = logits.clone()
    held[:, 4] = float("-inf")  # min_tokens holds back stop token 4
    out = sampling.apply_grammar(held, logits, allowed)
    assert torch.isinf(out[0]).tolist() == [True, False, False, True, True]
    assert torch.isinf(out[1]).tolist() == [True, True, True, True, False]


def test_bad_schemas_are_refused_with_the_engines_reason(compiler):
    with pytest.raises(InvalidRequestError) as err:
        compiler.check(Grammar("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "nonsense"}}})))
    assert err.value.param == "response_format" and "nonsense" in str(err.value)
    compiler.check(Grammar("json_schema", json.dumps(SCHEMA)))


def test_a_grammar_makes_params_adjust_logits():
    assert SamplingParams(temperature=0, grammar=Grammar("json_object")).adjusts_logits
    with pytest.raises(InvalidRequestError):
        Grammar("yaml")


def test_constrain_tree_drops_forbidden_subtrees_and_adds_forced_tokens(compiler, tokenizer):
    """Tree (root r): r -> '{' -> '"' and r -> 'x' -> '{'. 'x' cannot start a JSON object, so it
    goes with its child. The schema forces '{"a": ' from the start: the forced chain follows the
    kept '{' and '"' nodes and continues below them while room is left."""
    grammar = Grammar("json_schema", json.dumps(SCHEMA))
    masks = GrammarMasks(compiler)
    brace, quote = (tokenizer.convert_tokens_to_ids(t) for t in ("{", '"'))
    x = tokenizer.encode("x", add_special_tokens=False)[0]
    root = 7  # the request has no output yet: the root is the prompt's last token
    forced = compiler.matcher(grammar).compute_ff_tokens()
    assert forced[:2] == [brace, quote] and len(forced) >= 4
    tokens, parents = masks.constrain_tree("t", grammar, [], [root, brace, quote, x, brace], [-1, 0, 1, 0, 3], room=4)
    assert tokens == [root, brace, quote, *forced[2:4]] and parents == [-1, 0, 1, 2, 3]
    tokens, parents = masks.constrain_tree("t", grammar, [], [root, brace, quote, x, brace], [-1, 0, 1, 0, 3], room=2)
    assert tokens == [root, brace, quote] and parents == [-1, 0, 1]
    chain, chain_parents = masks.constrain_tree("t", grammar, [], [root], [-1], room=3)
    assert chain == [root, *forced[:3]] and chain_parents == [-1, 0, 1, 2]
