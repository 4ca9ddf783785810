"""The engine: requests in, token and text deltas out, one scheduler/worker step at a time.

    scheduler.schedule()  -> ScheduledBatch   (pure Python bookkeeping)
    worker.execute(batch) -> StepResult       (all tensor work)
    scheduler.update()                        (append tokens, finish, free)
    detokenize, stop strings -> RequestOutput

Not thread-safe: one thread owns an Engine (the server runs it in a background thread). The
exceptions are `tokenizer`, a SharedTokenizer that any thread may call (the server's event loop
tokenizes chat prompts and /tokenize requests with it), and `apply_chat_template`, which only
uses it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from eagle_core.batch import ScheduledBatch, SeqResult
from eagle_core.chat import chat_prompt_ids
from eagle_core.config import EngineConfig
from eagle_core.detokenizer import IncrementalDetokenizer
from eagle_core.errors import InvalidRequestError
from eagle_core.kv import BlockManager
from eagle_core.outputs import RequestOutput, SpecStats, TokenSource
from eagle_core.request import Request
from eagle_core.sampling_params import SamplingParams
from eagle_core.scheduler import Scheduler
from eagle_core.shared_tokenizer import SharedTokenizer
from eagle_core.spec.policy import SpeculationPolicy
from eagle_core.step_costs import measure_step_costs
from eagle_core.worker.worker import Worker

logger = logging.getLogger(__name__)


class SpecCounters:
    """Cumulative speculation counters over all requests."""

    def __init__(self, num_draft_tokens: int):
        self.num_drafts = 0
        """Sequence-steps that verified a draft tree."""
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_position = [0] * max(1, num_draft_tokens - 1)
        """[k] = sequence-steps whose accepted path reached depth k + 1."""
        self.fallbacks: dict[str, int] = {}
        """Decode steps of a speculating engine that ran without drafts, by reason."""

    def count(self, batch: ScheduledBatch, result) -> None:
        for work in batch.seqs:
            seq_result = result.results.get(work.request_id)
            if seq_result is None or not work.is_decode:
                continue  # prefill steps never draft
            if seq_result.num_draft_tokens == 0:
                reason = work.draft_skip_reason or "no_draft"  # no_draft: a tree found no candidate
                self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
                continue
            self.num_drafts += 1
            self.num_draft_tokens += seq_result.num_draft_tokens
            self.num_accepted_tokens += seq_result.num_accepted_tokens
            for position in range(min(seq_result.num_accepted_tokens, len(self.accepted_per_position))):
                self.accepted_per_position[position] += 1

    def as_dict(self) -> dict:
        return {
            "spec_num_drafts": self.num_drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_accepted_per_position": list(self.accepted_per_position),
            "spec_fallbacks": dict(self.fallbacks),
        }


@dataclasses.dataclass
class _Tracked:
    """Engine-side state of a live request: text and statistics."""

    request: Request
    detok: IncrementalDetokenizer
    spec: SpecStats = dataclasses.field(default_factory=SpecStats)
    first_token_time: float | None = None


class Engine:
    def __init__(self, config: EngineConfig | None = None):
        config = config or EngineConfig()
        self.worker = Worker(config)
        self.config = self.worker.config  # with derived values filled in (max_model_len, KV size)
        self.tokenizer = SharedTokenizer(self.worker.tokenizer)
        self.model_name = self.worker.model_name
        self.max_model_len = self.config.model.max_model_len
        cache = self.config.cache
        self.block_manager = BlockManager(cache.kv_cache_tokens // cache.block_size, cache.block_size, cache.prefix_caching)
        spec = self.config.spec
        self.policy: SpeculationPolicy | None = None
        """Chooses who drafts each step and the trees' size, unless --spec-max-batch pins it
        (spec/policy.py)."""
        if self.worker.num_tree_slots and spec.max_batch is None:
            costs = measure_step_costs(self.worker, self.config, self.block_manager)
            self.policy = SpeculationPolicy(
                costs,
                max_tree_nodes=spec.num_draft_tokens,
                choose_size=config.spec.num_draft_tokens is None,  # --num-draft-tokens pins the size
                lookup=spec.lookup_max_batch is None,
                max_owed=spec.feature_window + cache.block_size,
                grafts=self.worker.num_lookup_slots > 0,
            )
        self.scheduler = Scheduler(
            self.config.scheduler,
            self.block_manager,
            num_draft_slots=self.worker.num_tree_slots,
            max_spec_batch=spec.max_batch or 0,
            num_lookup_slots=self.worker.num_lookup_slots,
            max_lookup_batch=spec.lookup_max_batch if spec.lookup_max_batch is not None else spec.max_batch or 0,
            policy=self.policy,
            draft_resumes=self.worker.draft_resumes,
        )
        self.eos_token_ids = self._eos_ids()
        self._tracked: dict[str, _Tracked] = {}
        self._pending: list[RequestOutput] = []
        self.num_steps = 0
        self.spec_enabled = self.worker.num_draft_slots > 0
        self.spec_counters = SpecCounters(self.worker.num_draft_slots + 1)

    # ---- public API -----------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> None:
        """Queue a request. Raises InvalidRequestError for input that can never be served."""
        prompt_ids = self._tokenize(prompt)
        vocab = self.worker.vocab_size
        if any(token >= vocab for token, _ in params.logit_bias):
            raise InvalidRequestError(f"logit_bias keys must be token ids in [0, {vocab})", param="logit_bias")
        if params.grammar is not None:
            self.check_grammar(params)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise InvalidRequestError(
                f"prompt has {len(prompt_ids)} tokens; this model's context is {self.max_model_len} "
                "tokens including the completion",
                param="prompt",
                code="context_length_exceeded",
            )
        max_output = room if params.max_tokens is None else min(params.max_tokens, room)
        request = Request(request_id, prompt_ids, params, max_output, self.eos_token_ids)
        self.scheduler.add(request)
        self._tracked[request_id] = _Tracked(
            request, IncrementalDetokenizer(self.tokenizer, prompt_ids, params.stop, params.skip_special_tokens)
        )

    def check_grammar(self, params: SamplingParams) -> None:
        """Raises InvalidRequestError when the request's grammar cannot be used: the grammar
        engine's reason, no grammar engine for this tokenizer, or ignore_eos (a complete
        document allows only the stop tokens). Compiled grammars are cached."""
        grammar = params.grammar
        if params.ignore_eos:
            raise InvalidRequestError(f"ignore_eos cannot be combined with {grammar.param}", param="ignore_eos")
        if self.worker.grammar_compiler is None:
            raise InvalidRequestError(self.worker.grammar_unavailable, param=grammar.param)
        self.worker.grammar_compiler.check(grammar)

    def abort(self, request_id: str) -> None:
        """Stop a request; its KV is freed now and an "abort" output comes with the next step."""
        if self.scheduler.finish(request_id, "abort") is not None:
            self._pending.append(self._output(self._tracked.pop(request_id), [], None))

    def step(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        batch = self.scheduler.schedule()
        if batch.is_empty and not batch.finished_request_ids:
            return outputs
        now = time.monotonic()
        for work in batch.seqs:
            request = self.scheduler.requests[work.request_id]
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        started = time.perf_counter()
        result = self.worker.execute(batch)
        if self.policy is not None:
            self.policy.observe(batch, result, time.perf_counter() - started)
        self.num_steps += 1
        decode_ids = {w.request_id for w in batch.seqs if w.is_decode}
        if self.spec_enabled:
            self.spec_counters.count(batch, result)
        for request, appended in self.scheduler.update(batch, result):
            tracked = self._tracked[request.request_id]
            seq_result = result.results[request.request_id]
            if request.request_id in decode_ids:
                tracked.spec.num_steps += 1
                tracked.spec.num_draft_tokens += seq_result.num_draft_tokens
                tracked.spec.num_accepted_tokens += seq_result.num_accepted_tokens
                tracked.spec.num_emitted_tokens += len(seq_result.new_token_ids)
            if tracked.first_token_time is None:
                tracked.first_token_time = time.monotonic()
            appended, text_ends = self._detokenize(tracked, appended)
            logprobs = seq_result.logprobs[: len(appended)] if seq_result.logprobs else None
            outputs.append(self._output(tracked, appended, logprobs, seq_result, text_ends))
            if request.is_finished:
                del self._tracked[request.request_id]
        return outputs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._pending)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def kv_cache_usage(self) -> float:
        return self.block_manager.usage

    @property
    def stats(self) -> dict:
        """Cumulative engine counters (the server exports them as Prometheus metrics)."""
        return {
            "num_steps": self.num_steps,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_running": self.num_running,
            "num_waiting": self.num_waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "prefix_cache_queried_tokens": self.scheduler.num_queried_tokens,
            "prefix_cache_hit_tokens": self.scheduler.num_cached_tokens,
            **self.spec_counters.as_dict(),
            "spec_policy": self.policy.as_dict() if self.policy is not None else None,
        }

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Prompt ids of a conversation (`tools` for templates that render them); message
        content never becomes control tokens unless ModelConfig.control_tokens_in_content
        (eagle_core/chat.py). Safe on any thread."""
        plain = not self.config.model.control_tokens_in_content
        return chat_prompt_ids(self.tokenizer, messages, plain_content=plain, tools=tools)

    # ---- helpers ----------------------------------------------------------------------------

    def _detokenize(self, tracked: _Tracked, appended: list[int]) -> tuple[list[int], list[int] | None]:
        """Add a step's tokens to the request's text; returns the tokens it keeps and, with
        SamplingParams.token_sources, the text's length after each of them (else None).

        With stop strings or token sources the tokens go in one at a time: a speculative step
        can accept tokens past the one that completes a stop string, and those are dropped
        (from the output ids, so usage and logprobs match the text), leaving exactly what plain
        decoding would have produced. A stop string wins over "length" when both end the
        request at one token."""
        request = tracked.request
        params = request.params
        if not params.stop and not params.token_sources:
            tracked.detok.add(appended)
            return appended, None
        num_before = request.num_output_tokens - len(appended)
        text_ends: list[int] = []
        kept_tokens = appended
        for kept, token_id in enumerate(appended, start=1):
            stopped = tracked.detok.add([token_id], find_stop=num_before + kept >= params.min_tokens)
            text_ends.append(len(tracked.detok.text))
            if stopped:
                cut = text_ends[-1]  # this step's earlier tokens end at the cut at most
                text_ends = [min(end, cut) for end in text_ends]
                del request.output_token_ids[num_before + kept :]
                if request.is_finished:
                    request.finish_reason = "stop"
                else:
                    self.scheduler.finish(request.request_id, "stop")
                kept_tokens = appended[:kept]
                break
        return kept_tokens, text_ends if params.token_sources else None

    def _tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt must not be empty", param="prompt")
            return list(self.tokenizer(prompt).input_ids)
        if not prompt:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        vocab = self.worker.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})", param="prompt")
        return list(prompt)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.worker.generation_eos, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return frozenset(ids)

    def _output(
        self,
        tracked: _Tracked,
        appended: list[int],
        logprobs,
        seq_result: SeqResult | None = None,
        text_ends: list[int] | None = None,
    ) -> RequestOutput:
        request = tracked.request
        finished = request.is_finished
        new_text = tracked.detok.release(finished)  # at the end this adds text held for a partial character
        sources = None
        if request.params.token_sources:
            ends = list(text_ends or [])
            if finished and ends:
                ends[-1] = len(tracked.detok.text)
            kinds = seq_result.token_sources if seq_result is not None else []
            sources = [TokenSource(kind, end) for kind, end in zip(kinds, ends)]
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=appended,
            new_text=new_text,
            finished=finished,
            finish_reason=request.finish_reason if finished else None,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens,
            new_logprobs=logprobs,
            spec=dataclasses.replace(tracked.spec),
            num_draft_tokens_step=seq_result.num_draft_tokens if seq_result else 0,
            num_accepted_tokens_step=seq_result.num_accepted_tokens if seq_result else 0,
            new_token_sources=sources,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=tracked.first_token_time,
        )
