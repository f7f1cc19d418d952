"""The speech-out pool's bookkeeping, without piper: who may open a synthesis, and whose sentence
is made next. `homeai.speech.tts` holds its lock around every call; nothing here is thread-safe
on its own, and nothing here imports piper, so it is tested without a voice.

**Admission** (`Admission`). A synthesis is one text spoken, or one answer spoken sentence by
sentence as it is written: it holds a slot from its first sentence until it ends or its listener
leaves, however slowly that listener reads. There are `tts.max_pending` slots; the last
`tts.voice_reserve` of them only the voice lane may take, so a household's read-alouds never
leave a spoken answer without room. A member (the service's `Caller.key`) holds at most
`tts.max_pending_per_member` slots: one more is refused as theirs (`SynthesisOverCap`, a 429),
while a pool full of others' work is the box's (`SynthesisBusy`, a 503).

**Order** (`FairQueue`). The sentences waiting are taken by priority (0 voice, 1 chat,
2 background), then by member share: the member served least audio so far goes first (ties: the
one served longest ago), then by arrival within a member. A member who starts waiting starts
level with the least served of those with work on the pool, so time spent idle is not banked
against the others. One member's eight streams thus share the workers with a neighbour's one stream
turn and turn about, not eight to one.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from typing import Hashable

from homeai.speech.base import SynthesisBusy, SynthesisOverCap

PRIORITY_VOICE, PRIORITY_CHAT, PRIORITY_BACKGROUND = 0, 1, 2


class Admission:
    """The syntheses open, in all and per member, against the pool's three bounds."""

    def __init__(self, max_pending: int, max_pending_per_member: int, voice_reserve: int):
        self.max_pending = max_pending
        self.max_pending_per_member = max_pending_per_member
        self.voice_reserve = voice_reserve
        self.num_open = 0
        self._open: Counter[str] = Counter()

    def open_of(self, member: str) -> int:
        return self._open[member]

    def open(self, member: str, priority: int) -> None:
        """Take a slot for `member`; SynthesisOverCap over their own cap, SynthesisBusy when the
        room their lane may use is full (voice may use all of it, the others all but the reserve)."""
        cap = self.max_pending_per_member
        if self._open[member] >= cap:
            raise SynthesisOverCap(f"text to speech: you already have {self._open[member]} syntheses pending, "
                                   f"the most one member may (tts.max_pending_per_member = {cap}); "
                                   "retry once one of them ends")
        room = self.max_pending - (0 if priority == PRIORITY_VOICE else self.voice_reserve)
        if self.num_open >= room:
            kept = "" if priority == PRIORITY_VOICE else f", {self.voice_reserve} of them kept for the voice lane"
            raise SynthesisBusy(f"text to speech is busy: its {self.max_pending} slots are taken "
                                f"(tts.max_pending{kept}); retry shortly")
        self._open[member] += 1
        self.num_open += 1

    def close(self, member: str) -> None:
        self._open[member] -= 1
        if not self._open[member]:
            del self._open[member]
        self.num_open -= 1


class FairQueue:
    """Items (a sentence's synthesis each) from `add` until `drop`: waiting, or taken to run and
    `put_back` after each chunk with their place kept. `charge` counts what a member was served."""

    def __init__(self):
        self._waiting: dict[int, dict[str, list[tuple[int, Hashable]]]] = {}  # priority -> member -> heap
        self._where: dict[Hashable, tuple[int, str, int]] = {}  # item -> (priority, member, arrival)
        self._is_waiting: set[Hashable] = set()
        self._active: Counter[str] = Counter()  # items added and not dropped, per member
        self._served: dict[str, int] = {}  # per active member: the audio made for them (bytes)
        self._last_turn: dict[str, int] = {}  # per active member: when they were last taken
        self._arrivals = itertools.count()
        self._turns = itertools.count()

    def __len__(self) -> int:
        """Items waiting (not running)."""
        return len(self._is_waiting)

    def add(self, item: Hashable, *, priority: int, member: str) -> None:
        if not self._active[member]:  # starts level with the least served of those with work here
            self._served[member] = min((self._served[m] for m in self._active), default=0)
        self._active[member] += 1
        self._where[item] = (priority, member, next(self._arrivals))
        self._push(item)

    def take(self) -> Hashable | None:
        """The next item to run, taken off the waiting (None when nothing waits)."""
        if not self._waiting:
            return None
        members = self._waiting[min(self._waiting)]
        member = min(members, key=lambda m: (self._served[m], self._last_turn.get(m, -1)))
        _arrival, item = heapq.heappop(members[member])
        self._forget_empty(self._where[item][0], member)
        self._is_waiting.discard(item)
        self._last_turn[member] = next(self._turns)
        return item

    def put_back(self, item: Hashable) -> None:
        """A taken item with more to make waits again, at its first place in its member's line."""
        self._push(item)

    def charge(self, item: Hashable, cost: int) -> None:
        """`item`'s member was served `cost` (a chunk's bytes of audio)."""
        member = self._where[item][1]
        self._served[member] += cost

    def drop(self, item: Hashable) -> None:
        """`item` is done (ended, or its listener left), waiting or not."""
        where = self._where.pop(item, None)
        if where is None:
            return
        priority, member, arrival = where
        if item in self._is_waiting:
            self._is_waiting.discard(item)
            heap = self._waiting[priority][member]
            heap.remove((arrival, item))
            heapq.heapify(heap)
            self._forget_empty(priority, member)
        self._active[member] -= 1
        if not self._active[member]:  # idle: what they were served is not held against them later
            del self._active[member], self._served[member]
            self._last_turn.pop(member, None)

    def _push(self, item: Hashable) -> None:
        priority, member, arrival = self._where[item]
        heapq.heappush(self._waiting.setdefault(priority, {}).setdefault(member, []), (arrival, item))
        self._is_waiting.add(item)

    def _forget_empty(self, priority: int, member: str) -> None:
        members = self._waiting[priority]
        if not members[member]:
            del members[member]
        if not members:
            del self._waiting[priority]
