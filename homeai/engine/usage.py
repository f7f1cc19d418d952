"""Who is using the box (issue 54): for each fair-share key (a member, or a trusted proxy's user
`member/user`), its requests running and waiting now, the tokens of its requests that finished in
the last hour, and the cells its sequences hold and its cached prefixes keep. Counts only, never
a prompt's or an answer's text: `/api/lanes` shows them to an admin (`api/lanes.py`).

`HourlyTokens.observe` is an `engine.on_finish` callback (the engine's loop thread); `of(engine)`
gives the engine's one counter, attached when first asked for (the runtime asks as the engine
starts). `members` reads the scheduler's queues and caches under the engine's lock, as
`Engine.state` does.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass

HOUR_S = 3600.0
BUCKET_S = 60.0  # tokens are summed a minute at a time: at most an hour's 60 buckets are kept


@dataclass(frozen=True)
class MemberUse:
    running: int = 0  # its requests holding cells (generating, or embedding inputs being read)
    waiting: int = 0  # queued, not yet admitted (a preempted one too, until it runs again)
    prompt_tokens_hour: int = 0  # prompt tokens of its requests finished in the last hour
    cached_tokens_hour: int = 0  # of them, found in the prompt cache instead of computed
    output_tokens_hour: int = 0  # tokens generated for them
    cells_used: int = 0  # cells its live sequences hold now (prompt and answer so far)
    cells_cached: int = 0  # cells of the cached prefixes its requests left, reusable by it


class HourlyTokens:
    """Each key's prompt, cached and output tokens over the last hour, a minute at a time."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._buckets: deque[tuple[int, Counter]] = deque()  # (minute, {(key, kind): tokens})
        self._lock = threading.Lock()

    def observe(self, stats) -> None:
        """One finished request (a `RequestStats`)."""
        minute = int(self.clock() // BUCKET_S)
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != minute:
                self._buckets.append((minute, Counter()))
                self._drop_old(minute)
            counts = self._buckets[-1][1]
            counts[(stats.member, "prompt")] += stats.prompt_tokens
            counts[(stats.member, "cached")] += stats.cached_tokens
            counts[(stats.member, "output")] += stats.output_tokens

    def totals(self) -> dict[str, dict[str, int]]:
        """{key: {"prompt", "cached", "output"}} over the last hour."""
        minute = int(self.clock() // BUCKET_S)
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            self._drop_old(minute)
            for _, counts in self._buckets:
                for (key, kind), n in counts.items():
                    out.setdefault(key, {"prompt": 0, "cached": 0, "output": 0})[kind] += n
        return out

    def _drop_old(self, minute: int) -> None:
        oldest = minute - int(HOUR_S // BUCKET_S) + 1
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()


_COUNTERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ATTACH = threading.Lock()


def of(engine) -> HourlyTokens:
    """The engine's hourly token counter, fed by its finished requests from the first call on."""
    with _ATTACH:
        counter = _COUNTERS.get(engine)
        if counter is None:
            counter = _COUNTERS[engine] = HourlyTokens()
            engine.on_finish.append(counter.observe)
        return counter


def members(engine) -> dict[str, MemberUse]:
    """Each key with anything running, waiting, cached or counted in the last hour, by key."""
    hour = of(engine).totals()
    running, waiting, used, cached = Counter(), Counter(), Counter(), Counter()
    with engine.lock:
        sched = engine.scheduler
        for request in [*sched.running, *sched.pools.embedding]:
            running[request.member] += 1
            used[request.member] += request.num_computed_tokens
        for queue in sched.waiting.values():
            for request in queue:
                waiting[request.member] += 1
        for cache in sched.pools.cache.values():
            for entry in cache.entries.values():
                if entry.member:
                    cached[entry.member] += len(entry.tokens)
    keys = sorted(set(running) | set(waiting) | set(cached) | set(hour))
    zero = {"prompt": 0, "cached": 0, "output": 0}
    return {key: MemberUse(running[key], waiting[key], hour.get(key, zero)["prompt"], hour.get(key, zero)["cached"],
                           hour.get(key, zero)["output"], used[key], cached[key]) for key in keys}
