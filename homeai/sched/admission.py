"""Admission: whether a waiting request gets a sequence and cells this step, and in which cache.

A request is admitted when its policy's admission is open, its cells fit (leaving a cell per
decoding sequence for the next step, and in the main cache the sequence ids background keeps),
and, for an interactive request, the readers keep their pace with it (`pacing.py`).

Where: a request may go in any cache of its lane that holds its prompt and answer
(`Request.pools`, its lane's own first); it goes in one that has room for it now (`place`): the
first (room counting cached prefixes, which it may evict, as everywhere), unless another holds a
prefix it may reuse longer by at least a whole step of reading (`max_step_tokens`: less is a
step of its first token's wait at most, not worth its answer attending over the other cache's
cells, a document's in the main one). So with a cache of their own for the interactive lanes, a
chat never waits for that cache while the main one has room, and a conversation whose last turn
was read in the main cache goes on there. Only when none has room does an interactive request
that may go in the main cache (every one's with one cache for all) preempt background there,
down to its minimum share (`share.py`): free room anywhere first, a preemption only where it is
the only way in now. A request preempted later is placed again the same way, in either cache.

Once a request of a class is refused in its caches, a larger one of that class and caches is
not tried again in the same step. A member at its share of the interactive readers waits while
another member's interactive request waits (`members.py`).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Mapping

from homeai.sched.layout import CacheLayout
from homeai.sched.members import MemberShare
from homeai.sched.pacing import Pacing
from homeai.sched.policy import Policy
from homeai.sched.pools import KVPools, Pool
from homeai.sched.queues import WaitingQueues
from homeai.sched.request import Kind, Request
from homeai.sched.share import BackgroundShare
from homeai.sched.step import Admissions, Moment, Step
from lanes.base import LanePolicy

Start = Callable[[Request, float], None]  # the scheduler's: a waiting request starts running (its sequence admitted)


class Admission:
    def __init__(self, policies: dict[str, LanePolicy], queues: WaitingQueues, pools: KVPools,
                 pacing: Pacing, share: BackgroundShare, policy: Policy, embed_chunked: bool, member_share: float,
                 start: Start, layout: CacheLayout):
        self.policies, self.queues, self.pools, self.start, self.layout = policies, queues, pools, start, layout
        self.waiting = queues.lanes
        self.members = MemberShare(policies, queues, pools, member_share)
        self.pacing, self.share, self.policy, self.embed_chunked = pacing, share, policy, embed_chunked
        self._targets = {name: p.itl_target_ms for name, p in policies.items()}

    def refused(self, request: Request, step: Step) -> bool:
        """A waiting generation request no smaller than one of its class and caches refused this step:
        `admit` refuses it first thing (asked before placing it, of each pair of a full house)."""
        return request.num_tokens >= step.admissions.failed_need.get((request.interactive, request.pools), math.inf)

    def admit(self, request: Request, step: Step, preempt: Callable[[Request], None]) -> bool:
        """Admit a waiting generation request now, if it may be, in the cache `place` gives it
        (`preempt` gives way a victim)."""
        memo, interactive, group = step.admissions, request.interactive, (request.interactive, request.pools)
        if request.num_tokens >= memo.failed_need.get(group, math.inf):
            return False  # a smaller request of this class could not get in this step (the cheapest check first)
        if not self.policy.admission_open(num_running=len(self.pools.running), num_admitted=memo.num_admitted,
                                          began_idle=step.began_idle):
            return False
        if interactive and not self.members.may_admit(request):
            return False
        if interactive and not self.keeps_pace(request, step):
            memo.failed_need[group] = request.num_tokens
            return False
        if self._prefix_being_read(request, step):
            return False  # it waits for the cells it will share, a step or so (before any preemption for it)
        while not self.place(request, step.num_decoding):
            if not interactive or not self._preempt_background(request, preempt):
                memo.failed_need[group] = request.num_tokens
                return False
        self.start(request, step.now)
        memo.num_admitted += 1
        return True

    def all_refused(self) -> bool:
        """Every waiting request would be refused this step, whatever its turn: no sequence id is
        free in a generating cache (nor held by a cached prefix), background in the main cache would
        give none up for an interactive request waiting there, and each pair's first is a generation
        request (an embedding input has a context of its own). With no request reading its input
        either (the caller's to know), placing chunks would place nothing and change nothing (but
        what admission learns of refusals, read by no one after): a full house's steps, where
        ranking every pair only to refuse each was a fifth of the planning."""
        pools = self.pools
        if any([pools.num_free_seqs(pool) for pool in pools.generating]):
            return False
        in_main = False  # an interactive request waits in the main cache (where background may give way)
        for lane, queue in self.waiting.items():
            if not queue:
                continue
            # Each pair's first is the one tried (a pair refused goes no further this step): in a
            # lane out of arrival order, any of its requests may be a pair's first.
            firsts = [pair[0] for pair in self.queues.pairs[lane].values()] if self.queues.in_arrival_order(lane) else queue
            if any([r.kind is not Kind.GENERATE for r in firsts]):
                return False
            if self.policies[lane].interactive and not in_main:
                in_main = any([Pool.MAIN in r.pools for r in firsts])
        return not in_main or self.background_victim_in_main() is None

    def admit_embedding(self, request: Request, step: Step) -> bool:
        if not self.pools.fits(Pool.EMBED, request.num_tokens):
            return False
        self.start(request, step.now)
        return True

    def rebalance(self, moment: Moment, preempt: Callable[..., None]) -> None:
        """At a step's start, before its shape: a member kept out of an interactive lane by another
        member's many sequences gets a reader slot (`members.py`)."""
        self.members.rebalance(moment.eligible, lambda r: self.would_admit(r, moment), lambda r: preempt(r, None))

    def would_admit(self, request: Request, moment: Moment) -> bool:
        """A waiting interactive request keeps the readers' pace and gets its cells in one of its caches
        (background giving way in the main one), one cell kept per decoding sequence. (Every check is
        pure: cells first, which settle most refusals of a full house more cheaply than the pace.)"""
        decoding = self._decoding(moment)
        if (not any([self.fits(request, decoding, pool) for pool in request.pools])
                and self.background_victim(request) is None):
            return False
        return self.keeps_pace(request, moment)

    def _decoding(self, moment: Moment) -> Counter[Pool]:
        """Sequences decoding per pool, counted again only when the running set changed."""
        memo = moment.admissions
        if memo.decoding is None or memo.decoding[0] != self.pools.version:
            memo.decoding = self.pools.version, Counter(r.pool for r in moment.running(self.pools)[0])
        return memo.decoding[1]

    def keeps_pace(self, request: Request, moment: Moment) -> bool:
        memo: Admissions = moment.admissions
        if memo.readers is None or memo.readers[0] != self.pools.version:  # the running set changed
            memo.readers = self.pools.version, self.pacing.readers(self.pools.running, self.pools.version,
                                                                   self._targets, self.layout)
        return self.pacing.readers_keep_pace(moment.cost, memo.readers[1], request, self._targets[request.lane],
                                             self.layout)

    def fits(self, request: Request, num_decoding: Mapping[Pool, int], pool: Pool | None = None) -> bool:
        """A free sequence id and cells for a waiting request in `pool` (its own, `Request.pool`, if
        not given), leaving a cell per decoding sequence (`num_decoding`, per pool) for the next step,
        and an interactive request in the main cache the sequence ids background keeps there. Cells a
        live sequence there would lend it are not asked for again (`KVPools.fits_sharing`)."""
        pool = pool or request.pool
        num_free = self.pools.num_free_seqs(pool)
        headroom = num_decoding.get(pool, 0)
        if not num_free or not (self.pools.fits(pool, request.num_tokens, headroom)
                                or self.pools.fits_sharing(request, pool, headroom)):
            return False
        if request.interactive and pool is Pool.MAIN:
            return num_free > self.share.seq_reserve(self.waiting)
        return True

    def place(self, request: Request, num_decoding: Mapping[Pool, int]) -> bool:
        """Give a waiting request the cache it goes in now (`Request.pool`): the first of its caches
        with room for it now (`fits`), unless a later one holds a prefix it may reuse
        (`KVPools.prefix_in`) longer by a whole step of reading. False, its pool left as it was,
        when none has room."""
        pools = request.pools
        if len(pools) == 1:  # one cache for every lane, a background request, a prompt only one cache holds
            return self.fits(request, num_decoding)
        room = [pool for pool in pools if self.fits(request, num_decoding, pool)]
        if not room:
            return False
        request.pool = room[0]
        if len(room) > 1:
            reuse = [self.pools.prefix_in(request, pool) for pool in room]
            longest = max(reuse)
            if longest >= reuse[0] + self.pacing.max_step_tokens:
                request.pool = room[reuse.index(longest)]
        return True

    def _prefix_being_read(self, request: Request, step: Step) -> bool:
        """A sequence in the request's first cache is still reading a prefix it shares: it waits for
        those cells, a step or so, rather than read them a second time beside it. (Not for one being
        read in another cache: `place` follows a prefix there only when it is a step's reading longer,
        and a request never waits for a cache while another has room for it.)"""
        return self.pools.shares_a_prefix_being_read(request, step.running(self.pools)[1], request.pools[0])

    def background_victim(self, request: Request) -> Request | None:
        """The background sequence an interactive request that fits none of its caches preempts: one
        in the main cache, if the request may go there, while background holds more than its minimum
        share (None: none)."""
        if Pool.MAIN not in request.pools:
            return None  # background's cells are not ones it may use
        return self.background_victim_in_main()

    def background_victim_in_main(self) -> Request | None:
        """The background sequence of the main cache that gives way for interactive work (None: none)."""
        victim = self.pools.victim(Pool.MAIN)
        return victim if victim is not None and not victim.interactive and self.share.may_preempt() else None

    def _preempt_background(self, request: Request, preempt: Callable[[Request], None]) -> bool:
        """Preempt background for an interactive request, unless it is down to its minimum share (or
        holds none of the cells the request needs)."""
        victim = self.background_victim(request)
        if victim is None:
            return False
        preempt(victim)
        return True

    def prompt_can_go(self, moment: Moment) -> bool:
        """An interactive prompt is part-read, or an eligible one would be admitted now. One that
        would not (its cache full, or the readers at their pace) is no reason to hold background
        back or to size the step for it."""
        decoding_now, reading = moment.running(self.pools)
        if any(r.interactive for r in reading):
            return True
        decoding = len([r for r in decoding_now if r.interactive])
        for lane, queue in self.waiting.items():
            if not queue or not self.policies[lane].interactive:
                continue
            head = self.queues.first(pair[0] for pair in self.queues.pairs[lane].values()
                                     if self.members.may_admit(pair[0]))  # the lane's first such
            if head is None or not moment.eligible(head):
                continue
            if not self.layout.prompt_fits(head, lambda r: self._prompt_room(r, decoding)):
                continue
            if self.keeps_pace(head, moment):
                return True
        return False

    def _prompt_room(self, request: Request, num_decoding: int) -> bool:
        """An interactive prompt gets its cells now (`num_decoding` sequences keeping a cell each):
        they are free in one of its caches, or background in the main one gives them up."""
        return (any([self.pools.fits(pool, request.num_tokens, num_decoding) for pool in request.pools])
                or self.background_victim(request) is not None)

    def background_usable(self, step: Step, room: int) -> int | None:
        """How many tokens background prefill or embedding work could take this step (so a reserve
        is not wasted); None when none is backlogged and eligible."""
        if any(not r.interactive for r in step.reading(self.pools)):
            return room
        usable = None
        for lane, queue in self.waiting.items():
            if self.policies[lane].interactive or not queue:
                continue
            head = queue[0]
            # A request that cannot get its cells now (say, preempted for the chat that holds
            # them) could not use a reserve: keeping one would starve the chat, with nothing run.
            admissible = head.kind is Kind.EMBED or self.fits(head, step.num_decoding)
            if admissible and step.eligible(head):
                if head.kind is not Kind.EMBED or self.embedding_may_go(head, room, step):
                    return room
                usable = 0
        return usable

    def embedding_may_go(self, request: Request, room: int, step: Step) -> bool:
        """A chunked input goes in what is left of the step. An atomic one larger than that
        overflows the step only when no interactive work is running or background is owed it."""
        n = request.num_tokens
        if self.embed_chunked or n <= room or self.share.atomic_may_overflow(n, request.lane, step.overdue):
            return True
        return not any(r.interactive for r in self.pools.running)
