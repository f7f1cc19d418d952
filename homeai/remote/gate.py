"""Admission to a remote lane: a bounded queue, a concurrency limit, fair share between members.

The remote does its own batching; what homeai keeps is the household's order. At most
`concurrency` requests are in flight; the others wait (at most `max_queue`, then `QueueFull`,
answered with 429). When a slot frees, it goes to the waiting member whose (lane, member)
virtual token counter is least, as the local scheduler does: a request is charged its prompt
estimate when admitted and settled with the remote's usage when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

from homeai.sched.fairshare import FairShare
from homeai.sched.scheduler import QueueFull


class GateClosed(Exception):
    """The server is shutting down: the gate admits nothing more."""


class Ticket:
    """One admitted request: settle it with the tokens the remote reports, release its slot."""

    def __init__(self, gate: "FairGate", member: str, num_prompt_estimate: int):
        self.gate, self.member = gate, member
        self.num_prompt_estimate = num_prompt_estimate
        self.settled = self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.gate._release(self.member)

    def settle(self, *, num_prompt: int | None, num_output: int) -> None:
        if self.settled:
            return
        self.settled = True
        extra_prompt = (num_prompt - self.num_prompt_estimate) if num_prompt is not None else 0
        self.gate.charge(self.member, num_in=max(extra_prompt, 0), num_out=num_output)


class FairGate:
    def __init__(self, lane: str, *, concurrency: int, max_queue: int, weight: float = 1.0,
                 w_in: float = 1.0, w_out: float = 2.0):
        self.lane = lane
        self.concurrency, self.max_queue, self.weight = concurrency, max_queue, weight
        self.fair = FairShare(w_in, w_out)
        self.waiting: dict[str, deque[asyncio.Future]] = {}  # member -> its waiters, oldest first
        self.running: dict[str, int] = {}  # member -> requests in flight
        self.num_rejected = 0
        self.closed = False

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    @property
    def num_running(self) -> int:
        return sum(self.running.values())

    async def acquire(self, member: str, num_prompt_estimate: int = 0) -> Ticket:
        """Wait for a slot: QueueFull if too many wait already, GateClosed once closed."""
        await self._admit(member)
        self.charge(member, num_in=num_prompt_estimate)
        return Ticket(self, member, num_prompt_estimate)

    @contextlib.asynccontextmanager
    async def slot(self, member: str, num_prompt_estimate: int = 0) -> AsyncIterator[Ticket]:
        """`acquire`, and release at the end of the block."""
        ticket = await self.acquire(member, num_prompt_estimate)
        try:
            yield ticket
        finally:
            ticket.release()

    def close(self) -> None:
        """Admit nothing more; those waiting get GateClosed."""
        self.closed = True
        for queue in self.waiting.values():
            for future in queue:
                if not future.done():
                    future.set_exception(GateClosed("the server is shutting down"))
        self.waiting.clear()

    async def _admit(self, member: str) -> None:
        if self.closed:
            raise GateClosed("the server is shutting down")
        if self.num_running < self.concurrency and not self.waiting:
            self._start(member)
            return
        if self.num_waiting >= self.max_queue:
            self.num_rejected += 1
            raise QueueFull(self.lane, self.max_queue)
        future = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(member, deque()).append(future)
        self._mark_backlogged()
        try:
            await future  # _grant_next has already counted it running
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self._release(member)  # granted just as the client left: hand the slot on
            else:
                self._forget(member, future)
            raise

    def _start(self, member: str) -> None:
        self.running[member] = self.running.get(member, 0) + 1
        self._mark_backlogged()

    def _release(self, member: str) -> None:
        num = self.running.get(member, 0) - 1
        if num > 0:
            self.running[member] = num
        else:
            self.running.pop(member, None)
        self._grant_next()

    def _forget(self, member: str, future: asyncio.Future) -> None:
        queue = self.waiting.get(member)
        if queue is not None and future in queue:
            queue.remove(future)
            if not queue:
                del self.waiting[member]
        self._grant_next()

    def _grant_next(self) -> None:
        while self.waiting and self.num_running < self.concurrency:
            _, member = self.fair.pick(self._key(m) for m in self.waiting)
            queue = self.waiting[member]
            future = queue.popleft()
            if not queue:
                del self.waiting[member]
            if future.done():  # cancelled meanwhile
                continue
            self._start(member)
            future.set_result(None)
        self._mark_backlogged()

    def _mark_backlogged(self) -> None:
        self.fair.set_backlogged({self._key(m) for m in (*self.waiting, *self.running)})

    def _key(self, member: str) -> tuple[str, str]:
        return (self.lane, member)

    def charge(self, member: str, *, num_in: int = 0, num_out: int = 0) -> None:
        self.fair.charge(self._key(member), weight=self.weight, num_in=num_in, num_out=num_out)

    def snapshot(self) -> dict:
        return {"queued": self.num_waiting, "running": self.num_running, "concurrency": self.concurrency,
                "rejected": self.num_rejected}
