"""Graceful shutdown, owned by the app rather than by uvicorn.

On SIGTERM or SIGINT (DrainingServer hands both to the app's Drain):
1. the app stops taking work: a new request on /v1/* or /tokenize gets a 503 `server_shutdown`
   error (OpenAI's format, Retry-After set) and /health answers 503 "stopping";
2. every request already accepted runs on for up to `--shutdown-timeout` seconds;
3. at that deadline a stream still running ends with a `server_shutdown` error event and
   `data: [DONE]` (server/streaming.py), and a request whose answer has not started gets a 503
   `server_shutdown` body instead;
4. once every accepted request has been answered, one log line counts the requests that finished
   and those that were cut, uvicorn is told to exit, and the process exits with status 0.
A second signal moves the deadline to now. Nothing accepted is dropped: a request either
completes or gets the explicit shutdown error. uvicorn's own graceful timeout, which cancels
handlers, only starts once the drain is over, when nothing but idle connections remain.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import anyio
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import error_response, shutting_down

logger = logging.getLogger(__name__)

BACKSTOP_S = 2.0
"""How long past the deadline a request whose response has started (a stream, which ends itself
at the deadline) may still run before it is cancelled."""
EXIT_GRACE_S = 5
"""uvicorn's graceful timeout once the drain is over: time to close connections, and to refuse a
request that arrived as the drain ended."""


class Drain:
    """The app's accepted requests, and the deadline by which they must end once the server
    stops. Lives on the event loop; `app.state.drain`."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.stopping = False
        self.deadline = math.inf
        """Event-loop time (anyio.current_time()) at which running requests are cut."""
        self.running = 0
        """Accepted requests whose handler has not returned."""
        self.cut = 0
        self.refused = 0
        self._running_at_start = 0
        self._scopes: dict[anyio.CancelScope, float] = {}  # open scope -> seconds past deadline
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ requests

    @contextmanager
    def accepted(self) -> Iterator[None]:
        """Counts one accepted request as running until its handler returns."""
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._changed.set()

    @contextmanager
    def bounded(self, past_deadline_s: float = 0.0) -> Iterator[anyio.CancelScope]:
        """A cancel scope that expires `past_deadline_s` after the deadline, also when the
        deadline is fixed (the server starts stopping) while the scope is open."""
        with anyio.CancelScope(deadline=self.deadline + past_deadline_s) as scope:
            self._scopes[scope] = past_deadline_s
            try:
                yield scope
            finally:
                del self._scopes[scope]

    def extend(self, scope: anyio.CancelScope, past_deadline_s: float) -> None:
        """Let an open `bounded` scope run until `past_deadline_s` after the deadline."""
        self._scopes[scope] = past_deadline_s
        scope.deadline = self.deadline + past_deadline_s

    def record_cut(self) -> None:
        self.cut += 1

    # ------------------------------------------------------------------ stopping

    def begin(self) -> None:
        """Stop taking requests; those running must end within timeout_s."""
        if self.stopping:
            return
        self.stopping = True
        self._running_at_start = self.running
        self._set_deadline(anyio.current_time() + self.timeout_s)

    def cut_now(self) -> None:
        """Move the deadline to now (a second signal)."""
        self._set_deadline(min(self.deadline, anyio.current_time()))

    def _set_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        for scope, past in self._scopes.items():
            scope.deadline = deadline + past

    async def run(self) -> None:
        """Stop taking requests and wait until every accepted one has been answered; then log
        what finished and what was cut, in one line."""
        started = anyio.current_time()
        self.begin()
        while self.running:
            self._changed.clear()
            await self._changed.wait()
        logger.info(
            "shutdown: of %d running requests %d finished and %d were cut at the %g s deadline; "
            "%d new requests refused (%.1f s)",
            self._running_at_start,
            self._running_at_start - self.cut,
            self.cut,
            self.timeout_s,
            self.refused,
            anyio.current_time() - started,
        )


class DrainMiddleware:
    """Refuses requests on `prefixes` once the drain has begun, and counts the others as running
    until their handler returns. A request still running at the deadline whose response has not
    started is cancelled and answered with a 503 `server_shutdown`; one whose response has
    started (a stream, which ends itself at the deadline) is cancelled BACKSTOP_S later."""

    def __init__(self, app: ASGIApp, drain: Drain, prefixes: tuple[str, ...], retry_after_s: int):
        self.app = app
        self.drain = drain
        self.prefixes = prefixes
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        drain = self.drain
        if drain.stopping:
            drain.refused += 1
            await error_response(shutting_down(self.retry_after_s))(scope, receive, send)
            return
        with drain.accepted():
            started = False
            with drain.bounded() as bounded:

                async def tracked_send(message: Message) -> None:
                    nonlocal started
                    if message["type"] == "http.response.start" and not started:
                        started = True
                        drain.extend(bounded, BACKSTOP_S)
                    await send(message)

                await self.app(scope, receive, tracked_send)
            if bounded.cancelled_caught:
                drain.record_cut()
                if not started:
                    await error_response(shutting_down(self.retry_after_s))(scope, receive, send)


class DrainingServer(uvicorn.Server):
    """uvicorn with SIGTERM and SIGINT handed to the app's Drain instead of uvicorn's shutdown;
    uvicorn is told to exit once the drain is over. The signal is not re-raised at exit (as
    uvicorn does), so a drained server exits with status 0."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler: it runs between two bytecodes of the loop's thread, so it only
        # schedules the work on the loop.
        assert self._loop is not None  # the handler is installed inside serve()
        self._loop.call_soon_threadsafe(self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self._draining is None:
            logger.info(
                "%s: refusing new requests; running ones get %g s to finish",
                name,
                self.drain.timeout_s,
            )
            self._draining = asyncio.ensure_future(self._drain_then_exit())
        else:
            logger.info("%s again: cutting the running requests now", name)
            self.drain.cut_now()

    async def _drain_then_exit(self) -> None:
        try:
            await self.drain.run()
        finally:
            self.should_exit = True
