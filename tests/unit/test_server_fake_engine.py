"""FakeEngine: a test double of eagle_core.Engine's public API, for the server's unit tests.

It "generates" deterministic text without a model, so server tests run in milliseconds:
- greedy requests spell out FakeEngine.REPLY (one character per token), then stop;
- sampled requests (temperature > 0) spell random lowercase letters from their seed;
- every decode step emits `tokens_per_step` tokens, like speculative decoding would, and fills
  in SpecStats accordingly; with token_sources, all but a step's last token are the head's
  drafts and the last the target's.
Knobs for error tests: `paused` (nothing runs, requests pile up in waiting), `fail_next_step`
(step() raises once), `step_delay` (slow steps, for disconnect tests).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from eagle_core.batch import TokenLogprob
from eagle_core.errors import InvalidRequestError
from eagle_core.outputs import RequestOutput, SpecStats, TokenSource
from eagle_core.sampling_params import SamplingParams


class FakeTokenizer:
    """One token per character: id = code point. Chat template: 'role: content\\n' lines."""

    eos_token_id = 0
    chat_template = "fake"
    vocab_size = 0x110000  # every code point

    def __call__(self, text: str):
        class Encoded:
            input_ids = self.encode(text)

        return Encoded()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        return self.encode(text) if tokenize else text


@dataclass
class _Req:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_output: int
    rng: random.Random
    output: list[int] = field(default_factory=list)
    text: str = ""
    released: int = 0
    spec: SpecStats = field(default_factory=SpecStats)
    text_ends: list[int] = field(default_factory=list)
    """The text's length after each of the current step's tokens."""


class FakeEngine:
    REPLY = "Hello from the fake engine. It has no model at all!"

    def __init__(self, max_model_len: int = 512, max_num_seqs: int = 8, tokens_per_step: int = 2):
        self.tokenizer = FakeTokenizer()
        self.model_name = "fake-model"
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.tokens_per_step = tokens_per_step
        self.paused = False
        self.fail_next_step: str | None = None  # message of the exception step() raises once
        self.step_delay = 0.0
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.aborted: list[str] = []
        self.added: list[str] = []
        self.peak_running = 0
        self._pending: list[RequestOutput] = []
        self._thread_ids: set[int] = set()

    # ---- the Engine API

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> None:
        self._note_thread()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not all(0 <= t < self.tokenizer.vocab_size for t in ids):  # as the real engine
            raise InvalidRequestError("prompt token ids out of range", param="prompt")
        if not ids:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        room = self.max_model_len - len(ids)
        if room < 1:
            raise InvalidRequestError(f"prompt has {len(ids)} tokens, too long", param="prompt")
        max_output = room if params.max_tokens is None else min(room, params.max_tokens)
        seed = params.seed if params.seed is not None else random.randrange(1 << 30)
        self.waiting.append(_Req(request_id, ids, params, max_output, random.Random(seed)))
        self.added.append(request_id)

    def abort(self, request_id: str) -> None:
        self._note_thread()
        for queue in (self.waiting, self.running):
            for req in list(queue):
                if req.request_id == request_id:
                    queue.remove(req)
                    self.aborted.append(request_id)
                    self._pending.append(self._output(req, [], "abort"))

    def step(self) -> list[RequestOutput]:
        self._note_thread()
        if self.fail_next_step is not None:
            message, self.fail_next_step = self.fail_next_step, None
            raise RuntimeError(message)
        outputs, self._pending = self._pending, []
        if self.paused:
            time.sleep(0.002)  # keep the engine thread from spinning a core
            return outputs
        if self.step_delay:
            time.sleep(self.step_delay)
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        self.peak_running = max(self.peak_running, len(self.running))
        for req in list(self.running):
            outputs.append(self._advance(req))
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._pending)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.apply_chat_template(messages)

    # ---- helpers

    def _note_thread(self) -> None:
        self._thread_ids.add(threading.get_ident())

    @property
    def used_threads(self) -> int:
        """How many threads called into the engine (the server must use exactly one)."""
        return len(self._thread_ids)

    def _next_char(self, req: _Req) -> str | None:
        if req.params.greedy:
            i = len(req.output)
            return self.REPLY[i] if i < len(self.REPLY) else None
        return chr(ord("a") + req.rng.randrange(26))

    def _advance(self, req: _Req) -> RequestOutput:
        new_ids: list[int] = []
        reason = None
        req.text_ends = []
        for _ in range(self.tokens_per_step):
            char = self._next_char(req)
            if char is None:
                reason = "stop"
                break
            req.output.append(ord(char))
            new_ids.append(ord(char))
            req.text += char
            stop = next((s for s in req.params.stop if s in req.text), None)
            if stop is not None:
                req.text = req.text[: req.text.index(stop)]
                reason = "stop"
            req.text_ends.append(len(req.text))
            if reason is not None:
                break
            if len(req.output) >= req.max_output:
                reason = "length"
                break
        req.spec.num_steps += 1
        req.spec.num_draft_tokens += 3
        req.spec.num_accepted_tokens += max(len(new_ids) - 1, 0)
        req.spec.num_emitted_tokens += len(new_ids)
        if reason is not None:
            self.running.remove(req)
        return self._output(req, new_ids, reason)

    def _output(self, req: _Req, new_ids: list[int], reason: str | None) -> RequestOutput:
        # Like the real detokenizer, hold back text that a stop string could still cut.
        hold = 0 if reason else max((len(s) - 1 for s in req.params.stop), default=0)
        end = max(req.released, len(req.text) - hold)
        delta = req.text[req.released : end]
        req.released = end
        logprobs = None
        if req.params.logprobs is not None and new_ids:
            k = req.params.logprobs
            logprobs = [
                TokenLogprob(
                    t, -0.25, [(t, -0.25), *[(ord("x") + j, -3.0 - j) for j in range(k - 1)]][:k]
                )
                for t in new_ids
            ]
        sources = None
        if req.params.token_sources:
            kinds = ["head"] * (len(new_ids) - 1) + ["target"]
            sources = [TokenSource(kind, end) for kind, end in zip(kinds, req.text_ends)]
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_ids,
            new_text=delta,
            new_token_sources=sources,
            finished=reason is not None,
            finish_reason=reason,
            num_prompt_tokens=len(req.prompt_ids),
            num_output_tokens=len(req.output),
            new_logprobs=logprobs,
            spec=SpecStats(**vars(req.spec)),
        )


def test_fake_engine_spells_reply_and_stops():
    engine = FakeEngine()
    engine.add_request("a", "hi", SamplingParams(temperature=0, max_tokens=None))
    text, reason = "", None
    while engine.has_unfinished():
        for out in engine.step():
            text += out.new_text
            reason = out.finish_reason
    assert text == FakeEngine.REPLY and reason == "stop"


def test_fake_engine_cuts_stop_strings_and_max_tokens():
    engine = FakeEngine()
    engine.add_request("a", "hi", SamplingParams(temperature=0, stop=["fake"], max_tokens=None))
    engine.add_request("b", "hi", SamplingParams(temperature=0, max_tokens=5))
    texts: dict[str, str] = {"a": "", "b": ""}
    reasons = {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] += out.new_text
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    assert texts == {"a": "Hello from the ", "b": "Hello"}
    assert reasons == {"a": "stop", "b": "length"}
