"""Errors eagle_core raises for bad input; the server maps them to OpenAI error bodies."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine cannot serve as asked. `param` names the offending field; `code`
    is OpenAI's error code (clients such as LangChain act on "context_length_exceeded")."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ModelLoadError(RuntimeError):
    """A model or draft head that cannot be loaded; the message says what was tried."""
