"""A member's share of an interactive lane: one member's many chats never keep another's out.

Fair share (`fairshare.py`) orders the turns of a lane's waiting requests; it cannot help a
request that finds every reader slot taken. So in an interactive lane one member holds at most
`member_seq_share` of the lane's readers (the sequences running in it, a waiting request
counted in: `cap`), whenever another member's request waits there:

* a waiting member below its cap is *entitled*: when it would not be let in now (the readers
  at their pace, or no cells or sequence id for it), the newest sequence of a member over its
  cap is preempted (by recompute: its output is kept) until it would be, so it goes in within
  a step or two, not when the flood's answers end;
* meanwhile a member at its cap is not admitted in that lane (its preempted sequence would
  otherwise take the slot straight back);
* when an interactive sequence needs cells its cache lacks, an over-cap member's newest gives
  way before the pool's own rule (latest admitted) would pick, say, the other member's chat.

A lone member uses every reader; the cap binds only while another member has work in the lane.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Callable

from homeai.sched.pools import KVPools
from homeai.sched.request import Request
from lanes.base import LanePolicy

Key = tuple[str, str]


class MemberShare:
    def __init__(self, policies: dict[str, LanePolicy], waiting: dict[str, deque[Request]], pools: KVPools,
                 share: float):
        self.policies, self.waiting, self.pools, self.share = policies, waiting, pools, share
        self.entitled: dict[str, set[str]] = {}  # per lane, this step's members waiting below their cap
        self.caps: dict[str, int] = {}  # per lane, this step's cap

    def cap(self, num_readers: int) -> int:
        """The most sequences one member holds among `num_readers` while another member waits (at least one)."""
        return max(1, math.floor(self.share * num_readers))

    def held(self, lane: str) -> Counter[str]:
        """Sequences running in a lane, per member."""
        return Counter(r.member for r in self.pools.running if r.lane == lane)

    def num_held(self, key: Key) -> int:
        """Sequences a (lane, member) pair has running (fair share's tie-break: fewer goes first)."""
        return sum(1 for r in self.pools.running if r.key == key)

    # ---- at a step's start ------------------------------------------------------------

    def rebalance(self, eligible: Callable[[Request], bool], room: Callable[[Request], bool],
                  preempt: Callable[[Request], None]) -> None:
        """Find each interactive lane's entitled members; for each whose first waiting request
        would not be let in (`room`), preempt over-cap members' newest sequences until it would."""
        self.entitled, self.caps = {}, {}
        for lane, queue in self.waiting.items():
            if not queue or not self.policies[lane].interactive:
                continue
            firsts: dict[str, Request] = {}
            for r in queue:
                if eligible(r):
                    firsts.setdefault(r.member, r)
            held = self.held(lane)
            if not firsts or len(set(held) | set(firsts)) < 2:
                continue  # a lone member may use every reader
            cap = self.cap(sum(held.values()) + 1)
            entitled = sorted((r for m, r in firsts.items() if held[m] + 1 <= cap), key=lambda r: held[r.member])
            if not entitled:
                continue
            self.caps[lane], self.entitled[lane] = cap, {r.member for r in entitled}
            for request in entitled:
                while not room(request):
                    victim = self._victim(lane, held, cap)
                    if victim is None:
                        break
                    preempt(victim)
                    held[victim.member] -= 1

    def may_admit(self, request: Request) -> bool:
        """A member at its cap waits while another member's entitled request waits in the lane."""
        others = self.entitled.get(request.lane)
        if not others or others == {request.member}:
            return True
        return self.held(request.lane)[request.member] + 1 <= self.caps[request.lane]

    # ---- when a sequence needs cells -----------------------------------------------------

    def make_room(self, request: Request, num_cells: int, preempt: Callable[[Request], None]) -> bool:
        """Before an interactive sequence's pool preempts by its own rule for the cells it needs,
        preempt over-cap members' newest sequences; False when `request` itself was one of them."""
        if not request.interactive:
            return True
        pool = self.pools.of(request)
        kv = self.pools.kv[pool]
        while num_cells - kv.length(request.seq_id) > kv.num_free_cells + kv.num_cached_cells:
            default = self.pools.victim(pool)
            if default is None or not default.interactive:
                return True  # background gives way first (one cache for every lane)
            victim = self._growth_victim(pool)
            if victim is None:
                return True
            preempt(victim)
            if victim is request:
                return False
        return True

    def _growth_victim(self, pool) -> Request | None:
        """The newest sequence of the member furthest over its cap in an interactive lane of
        `pool` where another member has work."""
        best, excess = None, 0
        for lane, policy in self.policies.items():
            if not policy.interactive:
                continue
            held = Counter(r.member for r in self.pools.running if r.lane == lane and self.pools.of(r) is pool)
            present = set(held) | {r.member for r in self.waiting[lane]}
            if len(present) < 2:
                continue
            cap = self.cap(sum(held.values()))
            for member, n in held.items():
                if n - cap > excess:
                    best, excess = (lane, member), n - cap
        return self._newest(*best) if best else None

    def _victim(self, lane: str, held: Counter[str], cap: int) -> Request | None:
        """The newest sequence of the member furthest over `cap` in `lane`."""
        member, n = max(held.items(), key=lambda kv: (kv[1], kv[0]), default=(None, 0))
        return self._newest(lane, member) if member is not None and n > cap else None

    def _newest(self, lane: str, member: str) -> Request | None:
        return next((r for r in reversed(self.pools.running) if r.lane == lane and r.member == member), None)
