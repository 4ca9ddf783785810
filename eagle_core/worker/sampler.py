"""Per-request sampling state and the sampling step of a forward (worker side)."""

from __future__ import annotations

import torch

from eagle_core import sampling
from eagle_core.batch import SeqWork, TokenLogprob
from eagle_core.sampling_params import SamplingParams


class Sampler:
    """Owns one torch.Generator per request, so a seeded request draws the same numbers alone or
    in any batch. Generators survive preemption (the recompute continues the same stream)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._generators: dict[str, torch.Generator] = {}

    def generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        gen = self._generators.get(request_id)
        if gen is None:
            gen = sampling.make_generator(params.seed, self.device)
            self._generators[request_id] = gen
        return gen

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._generators.pop(request_id, None)

    def process(
        self,
        logits: torch.Tensor,  # [R, vocab] float32 raw logits, one row per position to sample
        works: list[SeqWork],  # the request of each row
        histories: list[list[int]],  # output tokens before each row (output so far + path)
    ) -> torch.Tensor:
        """The distribution each row samples from ([R, vocab]): penalties, then temperature and
        filters (one-hot for greedy rows)."""
        params = [w.params for w in works]
        logits = sampling.apply_penalties(logits, [w.prompt_token_ids for w in works], histories, params)
        logits = sampling.hold_back_stop_tokens(
            logits, [len(h) for h in histories], params, [w.stop_token_ids for w in works]
        )
        return sampling.processed_probs(logits, params)

    def sample(
        self, logits: torch.Tensor, works: list[SeqWork]  # logits: [R, vocab] float32
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """One new token per row (plain decoding)."""
        probs = self.process(logits, works, [w.output_token_ids for w in works])  # [R, vocab]
        greedy = [w.params.greedy for w in works]
        generators = [self.generator(w.request_id, w.params) for w in works]
        token_ids = sampling.sample(probs, generators, greedy)
        return token_ids, self.logprobs(logits, token_ids, works)

    @staticmethod
    def logprobs(logits: torch.Tensor, token_ids: list[int], works: list[SeqWork]) -> list[TokenLogprob | None]:
        num_top = [w.params.logprobs for w in works]
        if all(n is None for n in num_top):
            return [None] * len(works)
        return sampling.compute_logprobs(logits, token_ids, num_top)
