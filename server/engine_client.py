"""Asyncio bridge to the synchronous, single-threaded eagle_core Engine.

One background thread owns the engine: it loads it, then loops
    apply queued commands (add / abort)  ->  engine.step()  ->  hand outputs to the event loop
and sleeps on a threading.Event when there is no work. Commands go in through a thread-safe
queue and are applied *between* steps, because the engine is not thread-safe. Outputs come back
to the event loop in one `call_soon_threadsafe` per step (not one per request), and are routed to
per-request asyncio queues there, so every asyncio object is only touched on the loop's thread.

A client request of n choices (or several completion prompts) becomes several engine requests
with ids `<request_id>-<i>`; RequestStream merges them back as (choice index, RequestOutput).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from eagle_core.errors import InvalidRequestError
from eagle_core.outputs import RequestOutput
from eagle_core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# How long the engine thread backs off after engine.step() raised, so that a persistently
# failing engine does not spin a core while it keeps answering requests with 500s.
_FAILURE_BACKOFF_S = 0.05

STATS_INTERVAL_S = 0.25
"""While the engine steps, `engine.stats` (cumulative counters and the speculation policy's
state, several dicts built in Python on the engine thread) is published at most this often,
and after the step that leaves the engine with nothing to do, before its outputs are handed
on: a scrape after the last request of a burst reads exact counters. The running and waiting
counts are published after every step."""


class EngineNotReady(RuntimeError):
    """The engine is still loading, has stopped (server shutdown), or failed (to load, or
    later: its loop died). `state` says which."""

    def __init__(self, state: str, message: str | None = None):
        super().__init__(message or state)
        self.state = state


class QueueFull(RuntimeError):
    """The engine's waiting queue (plus commands not yet applied) is at max_waiting."""


class EngineStepError(RuntimeError):
    """engine.step() raised while this request was in flight; the request was aborted."""


class RequestObserver(Protocol):
    """Follows every engine request on the loop thread (server/metrics.py is one). `now` is
    `time.monotonic()`, the engine's clock for its own timestamps in RequestOutput."""

    def on_submit(self, request_ids: list[str], now: float) -> None:
        """The requests are about to be queued (before the engine has accepted them)."""

    def on_outputs(self, outputs: list[RequestOutput], now: float) -> None:
        """One step's outputs, as they are handed to the request streams."""

    def on_forget(self, request_ids: list[str]) -> None:
        """The requests were rejected or failed: no (more) outputs will come for them."""


@dataclass
class _Add:
    items: list[tuple[str, str | list[int], SamplingParams]]
    future: asyncio.Future


@dataclass
class _Abort:
    request_ids: list[str]


class RequestStream:
    """The outputs of one client request's engine requests, merged in arrival order.

    Iterating yields (index, RequestOutput) until every engine request has finished. Call
    `abort()` when the client goes away; it is a no-op once everything has finished.
    """

    def __init__(self, client: EngineClient, request_ids: list[str]):
        self._client = client
        self.request_ids = request_ids
        self._index = {rid: i for i, rid in enumerate(request_ids)}
        self._unfinished = set(request_ids)
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    @property
    def finished(self) -> bool:
        return not self._unfinished

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        while self._unfinished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self._unfinished.clear()
                raise item
            if item.finished:
                self._unfinished.discard(item.request_id)
            yield self._index[item.request_id], item

    def abort(self) -> None:
        if self._unfinished:
            ids = sorted(self._unfinished)
            self._unfinished.clear()
            self._client.abort(ids)


class EngineClient:
    """Owns the engine thread. Create it, `start()` it inside the running event loop, then
    `submit()` requests. `state` is "loading", "ready" or "failed"."""

    def __init__(self, engine_factory: Callable[[], Any], max_waiting: int):
        self._factory = engine_factory
        self.max_waiting = max_waiting
        self.engine: Any = None
        self.state = "loading"
        self.load_error: BaseException | None = None
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, RequestStream] = {}  # loop thread only
        self._ready: asyncio.Event | None = None  # created in start(), on the loop
        # Queue accounting: requests submitted but not yet applied by the engine thread.
        self._pending_lock = threading.Lock()
        self._pending = 0
        # Snapshots published by the engine thread after each step (plain ints: atomic reads).
        self.num_running = 0
        self.num_waiting = 0
        self.peak_running = 0
        self.num_steps = 0
        self.engine_stats: dict[str, Any] = {}
        self._stats_at = -math.inf  # time.monotonic() of the last engine_stats snapshot
        # Told about every request's submit, outputs and failure on the loop thread (metrics).
        self.observers: list[RequestObserver] = []
        self.on_load_failed: Callable[[BaseException], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="eagle-engine", daemon=True)
        self._thread.start()

    async def wait_ready(self) -> None:
        assert self._ready is not None, "start() first"
        await self._ready.wait()
        if self.state != "ready":
            raise EngineNotReady(self.state, f"engine failed to load: {self.load_error}")

    def shutdown(self, timeout: float = 5.0) -> None:
        if self.state == "ready":
            self.state = "stopped"
        self._stop = True
        self._commands.put(None)
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ engine facts

    @property
    def model_name(self) -> str | None:
        return getattr(self.engine, "model_name", None) if self.engine else None

    @property
    def max_model_len(self) -> int | None:
        return getattr(self.engine, "max_model_len", None) if self.engine else None

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer; the real engine's is a SharedTokenizer, safe on this thread."""
        self.require_ready()
        return self.engine.tokenizer

    def chat_prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a chat conversation followed by the assistant's turn header (`tools`,
        OpenAI's list, for templates that render them).

        Runs on the caller's thread, which keeps the engine loop free of this work: the engine's
        tokenizer is a SharedTokenizer (eagle_core/shared_tokenizer.py), whose lock orders these
        calls with the engine thread's encoding and detokenizing."""
        self.require_ready()
        extra = {"tools": tools} if tools else {}
        if hasattr(self.engine, "apply_chat_template"):
            return list(self.engine.apply_chat_template(messages, **extra))
        ids = self.engine.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **extra
        )
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)

    def require_ready(self) -> None:
        """Raise EngineNotReady (a 503 on every /v1/* route) unless the engine is ready."""
        if self.state != "ready":
            raise EngineNotReady(self.state)

    # ------------------------------------------------------------------ requests (loop thread)

    async def submit(
        self,
        request_id: str,
        prompts: Sequence[str | list[int]],
        params: Sequence[SamplingParams],
    ) -> RequestStream:
        """Queue one engine request per (prompt, params) pair; return once the engine accepted
        them all. Raises QueueFull, EngineNotReady, or the engine's InvalidRequestError, all
        before any output exists, so the caller can still answer with an error status."""
        self.require_ready()
        assert len(prompts) == len(params)
        count = len(prompts)
        if count > self.max_waiting:  # a 429 would send the client into retries that never pass
            raise InvalidRequestError(
                f"this request needs {count} sequences (prompts x n); this server queues at most "
                f"{self.max_waiting} (--max-waiting)",
                "n",
            )
        with self._pending_lock:
            if self.num_waiting + self._pending + count > self.max_waiting:
                raise QueueFull()
            self._pending += count
        ids = [f"{request_id}-{i}" for i in range(count)]
        stream = RequestStream(self, ids)
        for rid in ids:
            self._streams[rid] = stream
        # Before the add is sent: its first outputs may be dispatched before this coroutine
        # resumes from `await future`.
        self._notify("on_submit", ids, time.monotonic())
        future = asyncio.get_running_loop().create_future()
        self._send(_Add(list(zip(ids, prompts, params, strict=True)), future))
        if self.state != "ready":  # the loop ended after require_ready: it will not see the add
            self._fail_queued_adds()
        try:
            await future
        except BaseException:
            # Rejected by the engine, or the client left while we waited: forget the streams
            # and make sure nothing of this request stays in the engine.
            for rid in ids:
                self._streams.pop(rid, None)
            if future.cancelled() or not future.done():
                stream.abort()
            raise
        return stream

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self._streams.pop(rid, None)
        self._send(_Abort(list(request_ids)))

    def _send(self, command: _Add | _Abort) -> None:
        self._commands.put(command)
        self._wake.set()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        now = time.monotonic()
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream._put(out)
                if out.finished:
                    del self._streams[out.request_id]
        self._notify("on_outputs", outputs, now)

    def _dispatch_error(self, request_ids: list[str], error: BaseException) -> None:
        for rid in request_ids:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                stream._put(error)
        self._notify("on_forget", request_ids)

    def _notify(self, event: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, event)(*args)
            except Exception:  # a metrics bug must not break serving
                logger.exception("request observer %s failed", event)

    def _fail_streams(self, error: BaseException) -> None:
        self._dispatch_error(list(self._streams), error)

    def _call_soon(self, fn: Callable, *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed during shutdown
            pass

    # ------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        try:
            t0 = time.perf_counter()
            self.engine = self._factory()
            logger.info("engine ready in %.1fs", time.perf_counter() - t0)
            self.state = "ready"
        except BaseException as exc:  # noqa: BLE001 - report any load failure, then stop
            logger.exception("engine failed to load")
            self.load_error = exc
            self.state = "failed"
            if self.on_load_failed is not None:
                self._call_soon(self.on_load_failed, exc)
            return
        finally:
            if self._ready is not None:
                self._call_soon(self._ready.set)
        try:
            self._loop_forever(self.engine)
        except BaseException as exc:  # noqa: BLE001 - a dead loop must be visible, not a hang
            logger.exception("engine loop died")
            self.load_error = exc
            self.state = "failed"  # /health turns 503 so an orchestrator restarts us
            self._call_soon(self._fail_streams, EngineStepError(str(exc)))
        finally:
            self._fail_queued_adds()

    def _fail_queued_adds(self) -> None:
        """Once the loop is gone nothing applies queued commands: answer the submits still
        waiting on theirs (they would otherwise wait forever)."""
        for command in self._queued_commands():
            if isinstance(command, _Add):
                with self._pending_lock:
                    self._pending -= len(command.items)
                self._call_soon(self._notify, "on_forget", [rid for rid, _, _ in command.items])
                self._call_soon(_resolve, command.future, EngineNotReady(self.state))

    def _loop_forever(self, engine: Any) -> None:
        active: set[str] = set()  # engine requests added and not yet finished
        while True:
            self._apply_commands(engine, active)
            if self._stop:
                return
            if not engine.has_unfinished():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = engine.step()
            except Exception as exc:
                logger.exception("engine.step() failed; aborting %d requests", len(active))
                self._fail_all(engine, active, exc)
                time.sleep(_FAILURE_BACKOFF_S)
                continue
            self.num_steps += 1
            for out in outputs:
                if out.finished:
                    active.discard(out.request_id)
            # Exact stats before the outputs that end a burst reach anyone (a scrape then counts them).
            self._publish_counts(engine, stats=not engine.has_unfinished())
            if outputs:
                self._call_soon(self._dispatch, outputs)

    def _queued_commands(self) -> Iterator[_Add | _Abort | None]:
        """Take the queued commands, without waiting for more."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply_commands(self, engine: Any, active: set[str]) -> None:
        for command in self._queued_commands():
            if isinstance(command, _Add):
                self._apply_add(engine, active, command)
            elif isinstance(command, _Abort):
                for rid in command.request_ids:
                    if rid in active:
                        engine.abort(rid)

    def _apply_add(self, engine: Any, active: set[str], command: _Add) -> None:
        added: list[str] = []
        error: BaseException | None = None
        try:
            for rid, prompt, params in command.items:
                engine.add_request(rid, prompt, params)
                added.append(rid)
                active.add(rid)
        except Exception as exc:  # InvalidRequestError (or a bug): all or nothing
            error = exc
            for rid in added:
                engine.abort(rid)
            rejected = [rid for rid, _, _ in command.items]
            self._call_soon(self._notify, "on_forget", rejected)
        self._publish_counts(engine)
        with self._pending_lock:
            self._pending -= len(command.items)
        self._call_soon(_resolve, command.future, error)

    def _fail_all(self, engine: Any, active: set[str], exc: BaseException) -> None:
        ids = sorted(active)
        for rid in ids:
            try:
                engine.abort(rid)
            except Exception:
                logger.exception("abort of %s failed", rid)
        active.clear()
        self._publish_counts(engine, stats=True)
        self._call_soon(self._dispatch_error, ids, EngineStepError(str(exc)))

    def _publish_counts(self, engine: Any, stats: bool = False) -> None:
        """The running and waiting counts; `engine.stats` too where `stats` is set or the last
        snapshot is STATS_INTERVAL_S old."""
        self.num_running = int(engine.num_running)
        self.num_waiting = int(engine.num_waiting)
        self.peak_running = max(self.peak_running, self.num_running)
        now = time.monotonic()
        if not stats and now - self._stats_at < STATS_INTERVAL_S:
            return
        self._stats_at = now
        snapshot = getattr(engine, "stats", None)
        if isinstance(snapshot, dict):
            self.engine_stats = dict(snapshot)


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
