"""server/heap.py: freed heap memory goes back to the OS, at most once per interval."""

from __future__ import annotations

import os

import pytest

from server.heap import HeapTrimmer, malloc_trim

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.skipif(malloc_trim() is None, reason="the C library has no malloc_trim")
def test_trims_at_most_once_per_interval():
    clock = FakeClock()
    trimmer = HeapTrimmer(interval_s=30, clock=clock)
    assert not trimmer.maybe_trim()  # no time has passed since construction
    clock.now = 29.9
    assert not trimmer.maybe_trim()
    clock.now = 30
    assert trimmer.maybe_trim()
    clock.now = 45
    assert not trimmer.maybe_trim()
    clock.now = 60
    assert trimmer.maybe_trim()
    assert trimmer.num_trims == 2


@pytest.mark.skipif(malloc_trim() is None or not os.path.exists("/proc/self/statm"), reason="glibc and /proc only")
def test_trim_returns_a_fragmented_heaps_free_pages():
    """Blocks freed with a survivor every 64 KiB stay mapped (the heap cannot shrink past the
    survivors) until malloc_trim gives their pages back."""
    clock = FakeClock()
    trimmer = HeapTrimmer(interval_s=1, clock=clock)
    blocks = [bytearray(4000) for _ in range(100_000)]  # ~400 MB from malloc's heap, not mmap
    for block in blocks:
        block[::PAGE] = b"x" * len(block[::PAGE])  # touch every page
    survivors = blocks[::16]
    del blocks
    before = rss_bytes()
    clock.now = 1
    assert trimmer.maybe_trim()
    after = rss_bytes()
    assert len(survivors) == 6250
    assert before - after > 200 * 2**20, (before, after)
