"""One tokenizer, two threads: the engine's tokenizer behind a lock."""

from __future__ import annotations

import functools
import threading
from typing import Any


class SharedTokenizer:
    """The engine's tokenizer, used by the engine thread (prompt encoding, detokenizing) and by
    the server's event loop (chat templates, /tokenize, logprob token texts).

    Invariant: every call into the wrapped tokenizer (a method call, `tokenizer(...)`, an
    attribute read) runs under this object's one lock, so no two calls overlap. A
    Hugging Face fast tokenizer is not safe to share otherwise: a call first sets state on its
    Rust tokenizer (`encode_special_tokens` from `split_special_tokens`, truncation, padding)
    and then encodes, so a call on another thread in between makes the first one tokenize with
    the other's settings (chat content read as control tokens), and `tokenizers` before 0.23.1
    raise "RuntimeError: Already borrowed". Holding the lock for a whole call keeps each call's
    settings and its encoding together; the cost is that a long encode on one thread makes the
    other wait for it.

    What calls return is not wrapped: a sub-object (`backend_tokenizer`) must not be kept and
    used across threads. Attributes cannot be set through this object (set them on the raw
    tokenizer before sharing it); only the loader and the worker hold the raw one.
    """

    __slots__ = ("_tokenizer", "_lock")

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        with self._lock:
            value = getattr(self._tokenizer, name)
        if not callable(value) or isinstance(value, type):
            return value

        @functools.wraps(value)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return value(*args, **kwargs)

        return locked

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._tokenizer(*args, **kwargs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tokenizer)
