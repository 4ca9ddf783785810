"""Structured outputs: a request's grammar as a token mask at every position it samples.

The grammar engine is llguidance (PyPI `llguidance`; docs/structured-outputs.md says why): a
request's `Grammar` compiles to an llguidance grammar once per distinct grammar, and each
request gets its own matcher, which tracks the tokens the request has output.

Contract with sampling (eagle_core/sampling.py, worker/sampler.py): a row that samples the
token after `history` (the request's output so far, plus the path below the root for a
draft-tree node) samples only among the tokens the grammar allows after `history`, the
request's stop tokens included once the grammar is complete. The same mask is applied to the
target's distribution at every tree node, so verification stays exact with respect to the
constrained distribution: a draft the grammar forbids has probability 0 and is never accepted.
A tree node whose own path leaves the grammar can never be reached; its row allows every token
(its draw is never used, and no row is left without a token to sample).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from eagle_core.errors import InvalidRequestError
from eagle_core.sampling_params import Grammar

logger = logging.getLogger(__name__)

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""JSON is written on one line with `, ` and `: ` between items (json.dumps' layout): free
whitespace lets a small model fill its answer with blank lines and never close the object."""


def grammar_text(grammar: Grammar) -> str:
    """The llguidance grammar of a request's `Grammar`. Raises InvalidRequestError (naming the
    request field) when it cannot be built."""
    import llguidance

    try:
        if grammar.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if grammar.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(grammar.source, defaults=JSON_OPTIONS)
        return llguidance.LLMatcher.grammar_from_regex(grammar.source)
    except (ValueError, TypeError) as err:
        raise InvalidRequestError(f"invalid {grammar.kind} grammar: {err}", param=grammar.param) from None


def unpack_bitmask(
    bitmask: torch.Tensor,  # [R, ceil(V / 32)] int32, bit j of word w allows token 32 * w + j
    vocab_size: int,
) -> torch.Tensor:  # [R, vocab_size] bool
    """llguidance's packed masks as booleans, one per token."""
    bits = torch.arange(32, dtype=torch.int32)  # [32]
    allowed = (bitmask[:, :, None] >> bits) & 1  # [R, W, 32]
    return allowed.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


class GrammarCompiler:
    """Compiles requests' grammars against one tokenizer; thread-safe (the server checks
    grammars from its event loop, the worker makes matchers on the engine thread)."""

    def __init__(self, hf_tokenizer, vocab_size: int):
        import llguidance.hf

        self.vocab_size = vocab_size
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size)
        self._compiled = functools.lru_cache(maxsize=256)(self._compile)

    def _compile(self, grammar: Grammar) -> str:
        import llguidance

        text = grammar_text(grammar)
        error = llguidance.LLMatcher.validate_grammar(text, self.tokenizer)
        if error:
            raise InvalidRequestError(f"invalid {grammar.kind} grammar: {error}", param=grammar.param)
        return text

    def check(self, grammar: Grammar) -> None:
        """Raises InvalidRequestError with the engine's reason when `grammar` cannot be used."""
        self._compiled(grammar)

    def matcher(self, grammar: Grammar):
        """A fresh llguidance matcher at the start of `grammar` (checked first)."""
        import llguidance

        return llguidance.LLMatcher(self.tokenizer, self._compiled(grammar), log_level=0)


@dataclass
class _State:
    matcher: object
    """The request's llguidance matcher, in the state after `consumed`."""
    consumed: list[int]


class GrammarMasks:
    """Each grammar-constrained request's matcher, moved to whatever history a row asks about.

    Rows come in the order a step samples them (a sequence's plain row, or its tree's nodes with
    every parent before its children), so moving the matcher from one row's history to the next
    rolls back and consumes a few tokens at most."""

    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler
        self._states: dict[str, _State] = {}

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._states.pop(request_id, None)

    def allowed(
        self,
        request_ids: list[str],
        grammars: list[Grammar | None],
        histories: list[list[int]],  # the output tokens before each row's sample
        stop_token_ids: list[frozenset[int]],  # the tokens that end each row's request
    ) -> torch.Tensor | None:  # [R, vocab] bool on the host; None when no row has a grammar
        """The tokens each row may sample (see the module docstring); rows without a grammar
        allow every token."""
        rows = [i for i, g in enumerate(grammars) if g is not None]
        if not rows:
            return None
        import llguidance.torch

        vocab = self.compiler.vocab_size
        bitmask = torch.full((len(grammars), (vocab + 31) // 32), -1, dtype=torch.int32)  # [R, W]
        accepting: list[int] = []
        for i in rows:
            history = histories[i]
            if history and history[-1] in stop_token_ids[i]:
                continue  # below a stop token: never reached
            state = self._state(request_ids[i], grammars[i])
            if not self._move(state, history):
                continue  # the path leaves the grammar: never reached
            if state.matcher.is_stopped():
                bitmask[i] = 0  # complete: only the stop tokens remain
            else:
                llguidance.torch.fill_next_token_bitmask(state.matcher, bitmask, i)
            if state.matcher.is_accepting():
                accepting.append(i)
        allowed = unpack_bitmask(bitmask, vocab)  # [R, vocab]
        for i in accepting:
            stops = [t for t in stop_token_ids[i] if t < vocab]
            allowed[i, stops] = True
        empty = ~allowed.any(dim=1)
        if bool(empty.any()):
            logger.warning("grammar allows no token at %d rows; they sample unconstrained", int(empty.sum()))
            allowed[empty] = True
        return allowed

    def constrain_tree(
        self,
        request_id: str,
        grammar: Grammar,
        history: list[int],  # the request's output so far (its last token is the tree's root)
        token_ids: list[int],  # [N] the tree's tokens, node 0 the root
        parents: list[int],  # [N] parent indices (parents before children), -1 for the root
        room: int,  # most non-root nodes the tree may have
    ) -> tuple[list[int], list[int]]:
        """The tree without the nodes the grammar forbids (and their subtrees), then with the
        tokens the grammar forces next added as a chain from the root (graft_chain: it
        follows nodes that agree with it, new nodes only where `room` is left). A forbidden
        node could never be accepted, and a forced token is accepted for sure, so the
        verified output is unchanged; only the target's work is."""
        from eagle_core.spec.lookup import graft_chain

        state = self._state(request_id, grammar)
        if not self._move(state, history):
            return token_ids, parents
        kept_tokens, kept_parents = [token_ids[0]], [-1]
        index = {0: 0}  # old node -> new node
        paths: dict[int, list[int]] = {0: []}
        for node in range(1, len(token_ids)):
            parent = parents[node]
            if parent not in index:
                continue
            path = paths[parent] + [token_ids[node]]
            if not self._move(state, history + path):
                continue
            index[node], paths[node] = len(kept_tokens), path
            kept_tokens.append(token_ids[node])
            kept_parents.append(index[parent])
        self._move(state, history)
        forced = state.matcher.compute_ff_tokens()
        return graft_chain(kept_tokens, kept_parents, forced, room - (len(kept_tokens) - 1))

    def _state(self, request_id: str, grammar: Grammar) -> _State:
        state = self._states.get(request_id)
        if state is None:
            state = _State(self.compiler.matcher(grammar), [])
            self._states[request_id] = state
        return state

    @staticmethod
    def _move(state: _State, history: list[int]) -> bool:
        """Bring the matcher to the state after `history`; False when the grammar rejects it
        (the matcher then stays after the longest accepted prefix)."""
        consumed = state.consumed
        common = 0
        limit = min(len(consumed), len(history))
        while common < limit and consumed[common] == history[common]:
            common += 1
        if common < len(consumed):
            state.matcher.rollback(len(consumed) - common)
            del consumed[common:]
        rest = history[common:]
        if not rest:
            return True
        valid = state.matcher.validate_tokens(rest)
        if valid and not state.matcher.consume_tokens(rest[:valid]):
            raise RuntimeError(f"grammar matcher failed on tokens it validated: {state.matcher.get_error()}")
        consumed += rest[:valid]
        return valid == len(rest)

