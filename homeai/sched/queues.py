"""The waiting queues: each lane's requests in the order they go, and each (lane, member) pair's.

A lane's queue (`lanes`: the scheduler's `waiting`) holds its waiting requests in arrival
order, a preempted one back at its head. Fair share, a member's share of the readers and
admission ask about pairs: which pairs have requests waiting, and each one's first. Asked
of the lanes' queues, that rescanned every waiting request each step (with 256 waiting, most
of a step's planning), so each pair's queue is kept beside its lane's, in the same order, as
requests come (`append`), go back after a preemption (`appendleft`) and leave (`remove`).

Eligibility (a batching window, `window.py`) goes by arrival: a request is eligible once its
lane's cutoff has passed its arrival, a preempted one always, and a lane's rules take its
requests up to the first that is not eligible. While a lane's queue is in arrival order (its
requests queued as they arrived, none preempted among them: so far always), those are exactly
each pair's requests up to the pair's own first ineligible one, and a pair's first eligible
request is its first or none. `in_arrival_order` says whether that holds; a lane queued
otherwise is scanned whole, as before.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Iterable

from homeai.sched.request import Request


class WaitingQueues:
    def __init__(self, lanes: Iterable[str]):
        self.lanes: dict[str, deque[Request]] = {lane: deque() for lane in lanes}
        # Per lane, per member with requests waiting there: those requests, in the lane's order.
        self.pairs: dict[str, dict[str, deque[Request]]] = {lane: {} for lane in self.lanes}
        self._place: dict[str, int] = {}  # request id -> where it stands in its lane (lower goes first)
        self._back, self._front = itertools.count(1), itertools.count(-1, -1)
        self._latest: dict[str, float] = {}  # per lane in arrival order, the latest arrival queued at its back
        self._unordered: set[str] = set()  # lanes not in arrival order (until their queue empties)
        self._fresh: dict[tuple[str, str], int | None] = {}  # `shortest_fresh`, per pair, until the pair changes

    # ---- the one way in and out --------------------------------------------------------

    def append(self, request: Request) -> None:
        """A new request, at the back of its lane."""
        lane = request.lane
        latest = self._latest.get(lane)
        if request.num_preemptions or (latest is not None and request.arrival_time < latest):
            self._unordered.add(lane)
        self._latest[lane] = request.arrival_time if latest is None else max(latest, request.arrival_time)
        self.lanes[lane].append(request)
        self._pair(request).append(request)
        self._place[request.request_id] = next(self._back)

    def appendleft(self, request: Request) -> None:
        """A preempted request, back at the head of its lane."""
        if not request.num_preemptions:
            self._unordered.add(request.lane)  # not one a preemption made eligible: keep to the scan
        self.lanes[request.lane].appendleft(request)
        self._pair(request).appendleft(request)
        self._place[request.request_id] = next(self._front)

    def remove(self, request: Request) -> None:
        """A request leaves its lane's queue (admitted, or aborted while it waited)."""
        lane, member = request.lane, request.member
        self.lanes[lane].remove(request)
        pairs = self.pairs[lane]
        pairs[member].remove(request)
        if not pairs[member]:
            del pairs[member]
        self._fresh.pop((lane, member), None)
        del self._place[request.request_id]
        if not self.lanes[lane]:  # empty: in order again, whatever came before
            self._unordered.discard(lane)
            self._latest.pop(lane, None)

    def _pair(self, request: Request) -> deque[Request]:
        self._fresh.pop(request.key, None)
        return self.pairs[request.lane].setdefault(request.member, deque())

    # ---- what the rules ask ------------------------------------------------------------

    def in_arrival_order(self, lane: str) -> bool:
        """The lane's eligible requests are each pair's first ones (see the module's docstring)."""
        return lane not in self._unordered

    def place(self, request: Request) -> int:
        """Where a waiting request stands in its lane's queue: lower goes first."""
        return self._place[request.request_id]

    def first(self, requests: Iterable[Request]) -> Request | None:
        """The one of `requests` (waiting in one lane) that stands first in its queue."""
        return min(requests, key=self.place, default=None)

    def shortest_fresh(self, lane: str, member: str) -> int | None:
        """The fewest tokens left to read of the pair's waiting requests with no output yet (None:
        none). A waiting request's counts do not change, so this is counted again only when the
        pair's queue changed."""
        key = (lane, member)
        if key not in self._fresh:
            queue = self.pairs[lane].get(member, ())
            self._fresh[key] = min((r.num_remaining for r in queue if not r.output_tokens), default=None)
        return self._fresh[key]
