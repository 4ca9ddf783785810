"""FastAPI application factory: wiring only (state, middleware, error handlers, routes).

`create_app(engine_client, settings)` holds no module-level state, so tests build as many apps as
they like. The app starts the engine client in its lifespan if nobody started it yet: uvicorn is
already listening while the model loads, so /health can answer 503 until the engine is ready.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from eagle_core.errors import InvalidRequestError
from server.engine_client import EngineClient, EngineNotReady, EngineStepError, QueueFull
from server.errors import (
    NOT_FAILURES,
    APIError,
    bad_request,
    engine_failed,
    error_body,
    error_response,
    internal_error,
    not_ready,
    queue_full,
    shutting_down,
)
from server.metrics import ServerMetrics
from server.routes import ClientGone, openapi_components, router, validation_error
from server.settings import ServerSettings
from server.shutdown import Drain, DrainMiddleware

logger = logging.getLogger(__name__)

# Paths that need the API key when one is set, and that a stopping server refuses. /health and
# /metrics stay open for probes and scrapers (they reveal no user data).
_PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/debug/")
PLAYGROUND_DIR = Path(__file__).with_name("playground")
"""The playground's static files: `GET /` is its page, its assets are under /playground/. Open
without the API key (they hold no data); the page sends the key its user enters."""


def create_app(engine_client: EngineClient, settings: ServerSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not engine_client.started:
            engine_client.start()
        yield
        engine_client.shutdown()

    app = FastAPI(title="eagle-serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine_client = engine_client
    app.state.settings = settings
    app.state.started_at = int(time.time())
    app.state.token_texts = None
    app.state.drain = Drain(settings.shutdown_timeout_s)
    app.state.metrics = ServerMetrics(
        engine_client, lambda: settings.served_model_name or engine_client.model_name or "default"
    )
    app.include_router(router)
    app.mount("/playground", StaticFiles(directory=PLAYGROUND_DIR), name="playground")

    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return FileResponse(PLAYGROUND_DIR / "index.html")

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    unexpected = _add_error_handlers(app)
    # Each add_middleware wraps the ones before it. CORS, outermost, must answer preflights
    # before the key check (browsers send no Authorization on OPTIONS) and must decorate every
    # answer: 401/413 from the guard and the 500s of unexpected errors too. The drain counts a
    # request as running until everything the app sends for it, a 500 included, is sent.
    app.add_middleware(UnexpectedErrorMiddleware, handler=unexpected)
    app.add_middleware(
        DrainMiddleware,
        drain=app.state.drain,
        prefixes=_PROTECTED_PREFIXES,
        retry_after_s=settings.retry_after_s,
    )
    app.add_middleware(
        GuardMiddleware, settings=settings, on_reject=app.state.metrics.record_failure
    )
    if settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
        )
    return app


def _openapi(app: FastAPI) -> dict:
    """FastAPI's OpenAPI document, completed: the request models the routes declare (they parse
    raw bodies, so FastAPI has no schema of its own for them), and without FastAPI's 422
    validation answer, which this server never gives (a bad request is a 400)."""
    if app.openapi_schema is None:
        document = FastAPI.openapi(app)
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(openapi_components())
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        for operations in document["paths"].values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
    return app.openapi_schema


def _add_error_handlers(app: FastAPI) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Register the error handlers; returns the one for unexpected exceptions."""
    settings: ServerSettings = app.state.settings

    def answer(request: Request, err: APIError) -> JSONResponse:
        if err.status >= 400 and err.code not in NOT_FAILURES:
            app.state.metrics.record_failure(err.code or str(err.status))
        return error_response(err)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return answer(request, exc)

    @app.exception_handler(InvalidRequestError)
    async def invalid_request(request: Request, exc: InvalidRequestError) -> JSONResponse:
        return answer(request, bad_request(exc.message, exc.param, exc.code))

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        loc = [str(p) for p in errors[0].get("loc", ()) if p != "body"] if errors else []
        param = ".".join(loc) or None
        msg = errors[0].get("msg", "invalid request") if errors else "invalid request"
        return answer(request, bad_request(f"Invalid value for '{param}': {msg}", param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        err = APIError(
            exc.status_code,
            str(exc.detail),
            "invalid_request_error",
            None,
            code,
            dict(exc.headers or {}),
        )
        return answer(request, err)

    @app.exception_handler(QueueFull)
    async def full(request: Request, exc: QueueFull) -> JSONResponse:
        return answer(request, queue_full(settings.retry_after_s))

    @app.exception_handler(EngineNotReady)
    async def loading(request: Request, exc: EngineNotReady) -> JSONResponse:
        if exc.state == "failed":
            return answer(request, engine_failed())
        if exc.state == "stopped":
            return answer(request, shutting_down(settings.retry_after_s))
        return answer(request, not_ready(settings.retry_after_s))

    @app.exception_handler(ClientGone)
    async def gone(request: Request, exc: ClientGone) -> Response:
        # Nobody reads this; 499 (nginx's "client closed request") keeps access logs honest.
        return Response(status_code=499)

    @app.exception_handler(EngineStepError)
    async def step_failed(request: Request, exc: EngineStepError) -> JSONResponse:
        return answer(request, internal_error())

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return answer(request, internal_error())

    # A pydantic ValidationError escaping a route is still the client's fault, never a 500.
    @app.exception_handler(ValidationError)
    async def pydantic_error(request: Request, exc: ValidationError) -> JSONResponse:
        return answer(request, validation_error(exc))

    return unexpected


class UnexpectedErrorMiddleware:
    """Answers an unexpected exception from a route with `handler`'s 500, inside the other
    middlewares. Starlette runs the handler registered for Exception outside all of them, so
    that 500 would reach a browser without CORS headers: a CORS failure instead of the error."""

    def __init__(self, app: ASGIApp, handler: Callable[[Request, Exception], Awaitable[Response]]):
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked_send)
        except Exception as exc:
            if started:  # part of a response is out: nothing to answer with any more
                raise
            response = await self.handler(Request(scope, receive), exc)
            await response(scope, receive, send)


class GuardMiddleware:
    """API key check and request body limit, as plain ASGI (no BaseHTTPMiddleware, which
    interferes with streaming responses and disconnect detection).

    The body is read here, up to the limit, and replayed to the app: a body over the limit is
    refused with 413 whether or not it declared a Content-Length.
    """

    def __init__(
        self,
        app: ASGIApp,
        settings: ServerSettings,
        on_reject: Callable[[str], None] | None = None,
    ):
        self.app = app
        self.on_reject = on_reject or (lambda reason: None)
        self.api_key = settings.api_key
        self.max_bytes = settings.max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if self.api_key and scope["method"] != "OPTIONS" and path.startswith(_PROTECTED_PREFIXES):
            if not self._authorized(scope):
                self.on_reject("invalid_api_key")
                await _send_error(
                    scope,
                    send,
                    401,
                    error_body(
                        "Invalid or missing API key: send 'Authorization: Bearer <key>'",
                        "authentication_error",
                        None,
                        "invalid_api_key",
                    ),
                    {"WWW-Authenticate": "Bearer"},
                )
                return
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            self.on_reject("request_too_large")
            await _send_error(scope, send, 413, self._too_large())
            return
        body, ok = await self._read_body(receive)
        if not ok:
            self.on_reject("request_too_large")
            await _send_error(scope, send, 413, self._too_large())
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    return hmac.compare_digest(token.strip().encode(), self.api_key.encode())
        return False

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnected while sending
                return b"".join(chunks), True
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return b"", False
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), True

    def _too_large(self) -> dict:
        return error_body(
            f"Request body too large: the limit is {self.max_bytes} bytes",
            "invalid_request_error",
            None,
            "request_too_large",
        )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that yields the already-read body once, then the real channel (so the app
    still sees http.disconnect)."""
    sent = False

    async def wrapped() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return wrapped


async def _send_error(
    scope: Scope, send: Send, status: int, body: dict, headers: dict | None = None
) -> None:
    response = JSONResponse(body, status_code=status, headers=headers)
    await response(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
