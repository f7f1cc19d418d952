"""A member's share of the interactive readers: one member's many chats never keep another's out.

Fair share (`fairshare.py`) orders the turns of waiting requests; it cannot help a request that
finds every reader slot taken. The interactive lanes (voice, chat) share their readers: one
pace, one cache. So one member holds at most `member_seq_share` of the interactive sequences
running (a waiting request counted in: `cap`) whenever another member's interactive request
waits (a flood on the voice lane, which goes first, would otherwise keep every chat out):

* a waiting member below its cap is *entitled*: when its first waiting request would not be let
  in now (the readers at their pace, or no cells or sequence id for it), the sequence of a member
  over its cap that the pool would give up first (lowest priority, newest) is preempted, by
  recompute (its output is kept), until it would be: it goes in within a step or two, not when
  the flood's answers end;
* meanwhile a member at its cap is not admitted to an interactive lane (its preempted sequence
  would otherwise take the slot straight back);
* when an interactive sequence needs cells its cache lacks, an over-cap member's sequence gives
  way before the pool's own rule (latest admitted) would pick, say, the other member's chat.

A lone member uses every reader; the cap binds only while another member has interactive work.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

from homeai.sched.pools import KVPools, Spare
from homeai.sched.queues import WaitingQueues
from homeai.sched.request import Request
from lanes.base import LanePolicy


class MemberShare:
    def __init__(self, policies: dict[str, LanePolicy], queues: WaitingQueues, pools: KVPools, share: float):
        self.policies, self.queues, self.waiting, self.pools, self.share = policies, queues, queues.lanes, pools, share
        self.lanes = sorted((name for name, p in policies.items() if p.interactive), key=lambda n: policies[n].priority)
        self.entitled: set[str] = set()  # this step's members waiting below their cap
        self.capped = 0  # this step's cap
        self._held: tuple[int, Counter[str]] | None = None  # the running set's version, and its counts

    def cap(self, num_readers: int) -> int:
        """The most sequences one member holds among `num_readers` while another member waits (at least one)."""
        return max(1, math.floor(self.share * num_readers))

    def held(self) -> Counter[str]:
        """Interactive sequences running, per member (a copy, for the caller to count down)."""
        return Counter(self._counts())

    def holdings(self) -> Counter[str]:
        """Interactive sequences running per member, as counted for the running set now (fair share's
        tie-break: fewer goes first). Read only: `held()` is the copy to count down."""
        return self._counts()

    def _counts(self) -> Counter[str]:
        """`held()`, counted again only when the running set changed (it is asked per waiting request)."""
        if self._held is None or self._held[0] != self.pools.version:
            self._held = self.pools.version, Counter(r.member for r in self.pools.running if r.interactive)
        return self._held[1]

    # ---- at a step's start ------------------------------------------------------------

    def rebalance(self, eligible: Callable[[Request], bool], room: Callable[[Request], bool],
                  preempt: Callable[[Request], None]) -> None:
        """Find the entitled members; for each whose first waiting request would not be let in
        (`room`), preempt over-cap members' sequences until it would."""
        self.entitled, self.capped = set(), 0
        if not any(self.waiting[lane] for lane in self.lanes):
            return  # nobody waits for a reader slot (most steps)
        firsts: dict[str, Request] = {}
        for lane in self.lanes:  # best priority first: a member's voice question before its chats
            for r in self._eligible_firsts(lane, eligible):
                firsts.setdefault(r.member, r)
        if not firsts:
            return
        held = self.held()
        if len(set(held) | set(firsts)) < 2:
            return  # a lone member may use every reader
        cap = self.cap(sum(held.values()) + 1)
        entitled = sorted((r for m, r in firsts.items() if held[m] + 1 <= cap), key=lambda r: held[r.member])
        self.entitled, self.capped = {r.member for r in entitled}, cap
        # Who would give way is asked first: with no member over its cap, no room is costed. Both are
        # pure, so the one found stands until a preemption changes the holdings.
        victim = self._victim(held, cap)
        for request in entitled:
            while victim is not None and not room(request):
                preempt(victim)
                held[victim.member] -= 1
                victim = self._victim(held, cap)

    def _eligible_firsts(self, lane: str, eligible: Callable[[Request], bool]) -> list[Request]:
        """Each member's first eligible request waiting in `lane`, in the lane's order: in a lane in
        arrival order, a pair's first or none (`queues.py`), else found by a scan."""
        if not self.queues.in_arrival_order(lane):
            return [r for r in self.waiting[lane] if eligible(r)]
        firsts = [pair[0] for pair in self.queues.pairs[lane].values() if eligible(pair[0])]
        return sorted(firsts, key=self.queues.place)

    def may_admit(self, request: Request) -> bool:
        """A member at its cap waits while another member's entitled request waits."""
        if not self.entitled or self.entitled == {request.member}:
            return True
        return self._counts()[request.member] + 1 <= self.capped

    # ---- when a sequence needs cells -----------------------------------------------------

    def make_room(self, request: Request, num_cells: int, preempt: Callable[[Request], None],
                  spare: Spare | None = None) -> bool:
        """Before an interactive sequence's pool preempts by its own rule for the cells it needs
        (sparing whom `spare` keeps), preempt over-cap members' sequences; False when `request`
        itself was one of them."""
        if not request.interactive:
            return True
        pool = request.pool
        kv = self.pools.kv[pool]
        while num_cells - kv.length(request.seq_id) > kv.num_free_cells + kv.num_cached_cells:
            default = self.pools.victim(pool, spare)
            if default is None or not default.interactive:
                return True  # background gives way first (in the main cache)
            held = self.held()
            others = {member for lane in self.lanes for member in self.queues.pairs[lane]}
            victim = self._victim(held, self.cap(sum(held.values()))) if len(set(held) | others) > 1 else None
            if victim is None:
                return True
            preempt(victim)
            if victim is request:
                return False
        return True

    def _victim(self, held: Counter[str], cap: int) -> Request | None:
        """The sequence the pool would give up first of the member furthest over `cap`."""
        member, n = max(held.items(), key=lambda kv: (kv[1], kv[0]), default=(None, 0))
        if member is None or n <= cap:
            return None
        ranked = [(r.priority, i, r) for i, r in enumerate(self.pools.running) if r.interactive and r.member == member]
        return max(ranked, key=lambda t: t[:2])[2]
