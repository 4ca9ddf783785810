"""Errors eagle_core raises for bad input; the server maps them to OpenAI error bodies."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine cannot serve as asked. `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class ModelLoadError(RuntimeError):
    """A model or draft head that cannot be loaded; the message says what was tried."""
