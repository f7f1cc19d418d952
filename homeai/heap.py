"""The process's free heap handed back to the system, soon after a burst of large buffers is freed.

glibc keeps what Python frees: a buffer larger than its mmap threshold is returned at once, but the
threshold rises to the largest such buffer freed (up to 32 MB), so later buffers of a few MB live in
the heap, and the heap's free pages stay in RSS. 100 Wyoming connections of 29 s of audio left RSS
380 MB higher once all had closed (`scripts/wyoming_memory.py`); 300 nearly complete 4 MB HTTP
bodies, 864 MB (issue 55; `scripts/http_memory.py`). glibc's malloc_trim(0) gives the free pages
back; it walks every arena, so it runs in a worker thread, once for a burst (`TrimSoon`).
A request's buffers often outlive it in reference cycles (an exception's traceback holds the frames
that held its body) that only a full collection frees: the HTTP listener's `TrimSoon(collect=True)`
runs the cyclic garbage collector first (300 closed 4 MB bodies: RSS 1,843 MB trimmed alone, 698 MB
collected and trimmed, against 702 MB before them).

    trim = TrimSoon()   # one per listener
    trim()              # a connection holding a large buffer closed: trimmed TRIM_DELAY_S later

Where the C library is not glibc (musl, macOS) there is nothing to call, and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc

TRIM_DELAY_S = 1.0  # after the first free of a burst, the heap is trimmed this much later (once for the burst)


def release_free_memory() -> None:
    """glibc's malloc_trim(0): freed heap pages go back to the system (a no-op where there is none)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class TrimSoon:
    """Calling it asks for one `release_free_memory` `delay_s` later, off the event loop (after a full
    garbage collection with `collect`); the calls made meanwhile are answered by that one, so the heap
    is walked at most once per `delay_s`."""

    def __init__(self, delay_s: float = TRIM_DELAY_S, *, collect: bool = False):
        self.delay_s, self.collect = delay_s, collect
        self._handle: asyncio.TimerHandle | None = None

    def __call__(self) -> None:
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.delay_s, self._now)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _now(self) -> None:
        self._handle = None
        asyncio.get_running_loop().run_in_executor(None, collect_and_release if self.collect else release_free_memory)


def collect_and_release() -> None:
    gc.collect()
    release_free_memory()


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        return libc
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_LIBC = _libc()
