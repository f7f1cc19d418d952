"""A request's events and their readers: `TokenEvent` and `FinishEvent`, and the `RequestStream` the
engine thread pushes them to and asyncio code (`async for`) or plain threads (`for`) read; `wake_all`
wakes the asyncio readers of many streams with one call into each event loop."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from homeai.engine.stats import RequestStats
from homeai.engine.text import TextStream
from homeai.sched.request import Request


class TokenEvent(NamedTuple):
    """One generated token's event (a named tuple, built with tuple's own constructor: one is made
    for every sequence every step, and a frozen dataclass costs several times as much)."""

    token: int
    text: str  # the new text this token makes safe to show (may be empty)
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class FinishEvent:
    reason: str  # stop | length | abort | error
    text: str  # text held back until the end (a partial stop string that was not one)
    stats: RequestStats
    embedding: object = None
    error: str | None = None


class RequestStream:
    """Events of one request, pushed by the engine thread, read from asyncio or plain threads."""

    def __init__(self, request: Request, engine: "Engine", loop: asyncio.AbstractEventLoop | None):
        self.request = request
        self.engine = engine
        self.text = TextStream(request.params.stop)
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._sleepers = 0  # plain threads waiting in `__iter__`: only they need the condition notified
        self._loop = loop
        self._wakeup = asyncio.Event() if loop else None
        self.finished: FinishEvent | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def push(self, event) -> None:
        """Queue an event and wake its asyncio reader now."""
        self.add(event)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wakeup.set)

    def add(self, event) -> None:
        """Queue an event; a plain thread's reader wakes now, an asyncio reader when `wake_all` says.
        (The event is queued before the sleepers are counted, and a sleeper is counted before it
        looks at the queue, so no wake-up is lost without taking the lock for every token.)"""
        self._items.append(event)
        if self._sleepers:
            self.wake_sleepers()

    def wake_sleepers(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _pop(self):
        try:
            return self._items.popleft()
        except IndexError:
            return None

    def __aiter__(self):
        return self

    async def __anext__(self):
        while True:
            if self._done_reading():
                raise StopAsyncIteration
            self._wakeup.clear()
            item = self._pop()
            if item is not None:
                return self._seen(item)
            await self._wakeup.wait()

    def __iter__(self):
        while not self._done_reading():
            with self._cond:
                self._sleepers += 1
                try:
                    self._cond.wait_for(lambda: self._items, timeout=1.0)
                finally:
                    self._sleepers -= 1
            item = self._pop()
            if item is not None:
                yield self._seen(item)

    def _seen(self, item):
        if isinstance(item, FinishEvent):
            self.finished = item
        return item

    def _done_reading(self) -> bool:
        return self.finished is not None and not self._items

    def abort(self) -> None:
        self.engine.abort(self.request_id)


def wake_all(streams: Sequence[RequestStream]) -> None:
    """Wake the asyncio readers of `streams`: one call into each event loop, however many streams."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for stream in streams:
        if stream._loop is not None:
            by_loop.setdefault(stream._loop, []).append(stream._wakeup)
    for loop, events in by_loop.items():
        if not loop.is_closed():
            loop.call_soon_threadsafe(_set_all, events)


def _set_all(events: list[asyncio.Event]) -> None:
    for event in events:
        event.set()
