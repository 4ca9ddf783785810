"""HTTP errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

Routes raise APIError (or let eagle_core's InvalidRequestError through); app.py turns both, and
every unexpected exception, into this body. Unexpected exceptions become a bare 500 whose message
never carries the exception text: tracebacks go to the log, not to the client.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(err.message, err.type, err.param, err.code),
        status_code=err.status,
        headers=err.headers,
    )


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(name: str) -> APIError:
    return APIError(
        404,
        f"The model '{name}' does not exist",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def queue_full(retry_after_s: int) -> APIError:
    return APIError(
        429,
        "The server is overloaded: the waiting queue is full, retry later",
        "rate_limit_error",
        None,
        "queue_full",
        {"Retry-After": str(retry_after_s)},
    )


def not_ready(retry_after_s: int) -> APIError:
    return APIError(
        503,
        "The model is still loading",
        "service_unavailable_error",
        None,
        "model_loading",
        {"Retry-After": str(retry_after_s)},
    )


NOT_FAILURES = ("model_loading", "server_shutdown")
"""Error codes that are not counted as failures: the server is starting or stopping on purpose."""


def shutting_down(retry_after_s: int) -> APIError:
    # The server is stopping on purpose (another replica can take the request): not a failure.
    return APIError(
        503,
        "The server is shutting down",
        "service_unavailable_error",
        None,
        "server_shutdown",
        {"Retry-After": str(retry_after_s)},
    )


def engine_failed() -> APIError:
    # No Retry-After: this process will not recover; /health is 503 so an orchestrator restarts it.
    return APIError(
        503,
        "The engine has failed and this server cannot serve requests until it is restarted",
        "service_unavailable_error",
        None,
        "engine_failed",
    )


def internal_error() -> APIError:
    return APIError(500, "Internal server error", "server_error", None, "internal_error")
