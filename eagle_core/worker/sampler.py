"""Per-request sampling state and the sampling step of a forward (worker side)."""

from __future__ import annotations

import torch

from eagle_core import sampling
from eagle_core.batch import SeqWork, TokenLogprob
from eagle_core.grammar import GrammarMasks


class Sampler:
    """Owns each request's random key (its seed, or a random one): its draws are a function of
    (key, output position), see eagle_core/sampling.py. A grammar-constrained request also has
    a grammar matcher (`grammars`), which follows whatever history a row samples after."""

    def __init__(self, device: torch.device, grammars: GrammarMasks | None = None):
        self.device = device
        self.grammars = grammars
        self._keys: dict[str, int] = {}

    def key(self, work: SeqWork) -> int:
        key = self._keys.get(work.request_id)
        if key is None:
            key = sampling.request_key(work.params.seed)
            self._keys[work.request_id] = key
        return key

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._keys.pop(request_id, None)
        if self.grammars is not None:
            self.grammars.drop(request_ids)

    def process(
        self,
        logits: torch.Tensor,  # [R, vocab] float32 raw logits, one row per position to sample
        works: list[SeqWork],  # the request of each row
        histories: list[list[int]],  # output tokens before each row (output so far + path)
    ) -> torch.Tensor:
        """The distribution each row samples from ([R, vocab]): logit bias, penalties, held-back
        stop tokens, the grammar's mask, then temperature and filters (one-hot for greedy
        rows)."""
        params = [w.params for w in works]
        logits = sampling.apply_logit_bias(logits.float(), params)
        logits = sampling.apply_penalties(logits, [w.prompt_token_ids for w in works], histories, params)
        held = sampling.hold_back_stop_tokens(
            logits, [len(h) for h in histories], params, [w.stop_token_ids for w in works]
        )
        allowed = self._allowed(works, histories)
        if allowed is not None:
            held = sampling.apply_grammar(held, logits, allowed.to(logits.device))
        return sampling.processed_probs(held, params)

    def _allowed(self, works: list[SeqWork], histories: list[list[int]]) -> torch.Tensor | None:
        """[R, vocab] bool on the host: the tokens each row's grammar allows; None without
        grammars."""
        grammars = [w.params.grammar for w in works]
        if all(g is None for g in grammars):
            return None
        if self.grammars is None:
            raise RuntimeError("a request has a grammar but this worker has no grammar engine")
        return self.grammars.allowed(
            [w.request_id for w in works], grammars, histories, [w.stop_token_ids for w in works]
        )

    def draw(
        self,
        logits: torch.Tensor,  # [R, vocab] float32 raw logits, one row per position to sample
        works: list[SeqWork],  # the request of each row
        histories: list[list[int]] | None = None,  # output tokens before each row; None: output so far
        depths: torch.Tensor | None = None,  # [R] long: a tree node's depth below its root; None: 0
    ) -> torch.Tensor:  # [R] long, on the device
        """One token per row from the row's processed distribution, without a host sync. A row
        at depth d samples output position len(output) + d. Rows of greedy requests without
        logit bias, penalties, grammar or held-back stop tokens are a plain argmax."""
        if all(w.params.greedy and not w.params.adjusts_logits and not w.holds_back_stop_tokens for w in works):
            return logits.argmax(dim=1)
        if histories is None:
            histories = [w.output_token_ids for w in works]
        probs = self.process(logits, works, histories)  # [R, vocab]
        greedy = [w.params.greedy for w in works]
        keys = torch.tensor([self.key(w) for w in works], dtype=torch.long)
        positions = torch.tensor([len(w.output_token_ids) for w in works], dtype=torch.long).to(logits.device)
        if depths is not None:
            positions = positions + depths.to(logits.device)
        return sampling.draw(probs, keys, positions, greedy)

    @staticmethod
    def logprobs(logits: torch.Tensor, token_ids: list[int], works: list[SeqWork]) -> list[TokenLogprob | None]:
        num_top = [w.params.logprobs for w in works]
        if all(n is None for n in num_top):
            return [None] * len(works)
        return sampling.compute_logprobs(logits, token_ids, num_top)
