"""Giving freed heap memory back to the OS from the engine thread (glibc's `malloc_trim`).

The step's tensors change shape with every batch, so the C heap holds freed blocks of many sizes
that glibc keeps mapped: a long-running server's RSS grows with its history, not with its load
(docs/benchmarks.md, "Soak"). `malloc_trim(0)` releases the free pages (at the heap's top and,
with `madvise`, inside it). `HeapTrimmer.maybe_trim()` calls it between engine steps, at most once
every `interval_s`, so its cost (a walk over the heap's free lists, well under a step's time)
never lands on more than one step in that interval. Where the C library has no `malloc_trim`
(musl, macOS), the trimmer does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

TRIM_INTERVAL_S = 30.0
"""Least time between two trims of one process."""


@functools.cache
def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim(pad) of this process, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Trims the heap at most once every `interval_s`; owned by one thread (not thread-safe)."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self._clock = clock
        self._last = clock()
        self.num_trims = 0

    def maybe_trim(self) -> bool:
        """Trim if `interval_s` has passed since the last trim (or since construction); True when
        this call trimmed."""
        now = self._clock()
        trim = malloc_trim()
        if trim is None or now - self._last < self.interval_s:
            return False
        trim(0)
        self._last = self._clock()
        self.num_trims += 1
        logger.debug("malloc_trim took %.1f ms", (self._last - now) * 1e3)
        return True
