"""The iteration-level scheduler: pure, deterministic, the clock an argument.

There is no prefill phase and no decode phase. Each request has `num_computed_tokens`
catching up with `num_tokens`; a step gives each chosen request some tokens, decodes first, then
prefill chunks and embedding inputs in what is left of its budget (`planning.py`), and what ran
is settled from the plan that ran (`settle.py`). `Scheduler` is those two halves over the state
they share, and owns the rest: requests in (`add_request`; the caches each may go in, `pools_for`)
and out (`abort`, `finish`), their lifecycle, KV growth and who gives way. Its limits and refusals
are `limits.py`'s.

An interactive request is admitted only while the readers keep their pace (`pacing.py`). KV
admission reserves cells (`pools.py`) in whichever cache of its lane holds the request and has
room for it then (`admission.py`; the caches that hold it, `pools_for`, are found when it comes:
its lane's own first, the main one too with two): the one with the longest prefix it may reuse,
else its lane's own; it keeps its lane's priority there. Only when none has room does an
interactive request that may go in the main cache preempt the lowest-priority, latest-admitted
background sequence there; a request preempted later is placed again by the same rule. Wherever
a sequence is preempted (admission, a sequence growing, llama.cpp finding no KV slot), background
down to its minimum share keeps its cells while an interactive sequence can give way. A member
holds at most its share of the interactive readers while another member waits for one (`members.py`).
Whether the interactive lanes have a cache of their own is chosen once (`layout.py`).

A request's status has one writer: the lifecycle methods here (`_start`, `_requeue`, `_finish`).
"""

from __future__ import annotations

import itertools
from collections import Counter, deque

from homeai.sched.admission import Admission
from homeai.sched.costmodel import StepCostModel
from homeai.sched.draft import DraftSettings, Drafting
from homeai.sched.fairshare import FairShare
from homeai.sched.layout import cache_layout
from homeai.sched.limits import NoRoom, QueueFull, SchedulerLimits, UnknownLane
from homeai.sched.pacing import Pacing
from homeai.sched.placement import Placement
from homeai.sched.plan import Output, ScheduledItem, StepPlan, StepResult
from homeai.sched.planning import Planning
from homeai.sched.policy import HOMEAI, Policy
from homeai.sched.pools import KVPools, Pool, PromptCache
from homeai.sched.prefix import Memory
from homeai.sched.queues import WaitingQueues
from homeai.sched.request import Kind, Request, Status
from homeai.sched.settle import PENDING, Settlement
from homeai.sched.share import BackgroundShare
from lanes.base import LanePolicy

__all__ = ["NoRoom", "Output", "PENDING", "QueueFull", "ScheduledItem", "Scheduler", "SchedulerLimits", "StepPlan",
           "StepResult", "UnknownLane"]


class Scheduler(Planning, Settlement):
    """The scheduler: a step planned (`Planning`), run elsewhere, and settled (`Settlement`), over the
    requests, queues, pools and rules held here."""

    def __init__(self, policies: dict[str, LanePolicy], limits: SchedulerLimits, policy: Policy = HOMEAI,
                 memory: Memory = Memory(), drafting: DraftSettings = DraftSettings()):
        """`memory`: where the model's sequences may be resumed (the runner's `kv_memory`; a plain cache's by
        default); `drafting`: which lanes' answers draft tokens (none by default: a runner must check them)."""
        self.policies, self.limits, self.policy = policies, limits, policy
        self.layout = cache_layout(limits.interactive_cells)  # chosen once: every rule that differs asks it
        self.pools = KVPools(caches=self.layout.caches(limits.num_cells, limits.num_seqs),
                             interactive=self.layout.interactive_pool, embed_cells=limits.embed_max_tokens,
                             embed_seqs=limits.embed_max_seqs,
                             prompt_cache=PromptCache(limits.prompt_cache, limits.prompt_cache_max_cells,
                                                      shared=limits.prompt_cache_shared), memory=memory)
        self.fair = FairShare(limits.w_in, limits.w_out)
        self.cost = StepCostModel()
        self.pacing = Pacing({name: float(limits.typical_output) for name in policies}, limits.max_step_ms,
                             limits.max_step_tokens, limits.min_chunk)
        self.share = BackgroundShare(policies, self.pools, min_share=limits.background_min_share,
                                     min_chunk=limits.min_chunk, max_step_tokens=limits.max_step_tokens,
                                     num_seqs=limits.num_seqs, num_cells=limits.num_cells,
                                     max_credit=max(limits.embed_max_tokens, limits.max_step_tokens))
        self.queues = WaitingQueues(policies)  # changed only through the lifecycle methods below
        self.waiting: dict[str, deque[Request]] = self.queues.lanes
        self.admission = Admission(policies, self.queues, self.pools, self.pacing, self.share, policy,
                                   limits.embed_chunked, limits.member_seq_share, self._start, self.layout)
        self.placement = Placement(policies, self.queues, self.pools, self.fair, self.admission, self.share,
                                   self._grow, self._preempt, limits.embed_chunked, self.pacing.tuning.held_step)
        # Drafting needs a cache cut back where the drafted tokens were refused: not a sliding window's
        # nor a recurrent state's (`Memory.cut_anywhere`)
        self.drafting = Drafting(drafting if memory.cut_anywhere else DraftSettings())
        self.requests: dict[str, Request] = {}
        # Requests not finished per (lane, member): fair share's backlogged pairs, kept as requests
        # come and go rather than gathered from every request each step.
        self._pairs: Counter[tuple[str, str]] = Counter()
        self._done: list[str] = []  # finished since the last plan: their sampler state may go
        self._steps = itertools.count()
        self._clock = 0.0  # the last time the scheduler was told (a finish without its own time)

    # ---- requests in and out -------------------------------------------------------

    def lane(self, name: str) -> LanePolicy:
        """A lane's policy; raises `UnknownLane`."""
        policy = self.policies.get(name)
        if policy is None:
            raise UnknownLane(name, self.policies)
        return policy

    def add_request(self, request: Request) -> None:
        policy = self.lane(request.lane)
        queue = self.waiting[request.lane]
        if len(queue) >= policy.max_queue:
            raise QueueFull(request.lane, policy.max_queue)
        request.interactive, request.priority = policy.interactive, policy.priority
        if request.kind is Kind.EMBED:
            request.pools = (Pool.EMBED,)
        else:
            request.pools = self.pools_for(request.lane, request.num_prompt_tokens, request.max_tokens)
            if not request.pools:
                raise NoRoom(request.lane, request.num_prompt_tokens + 1)
        request.pool = request.pools[0]  # a guess until it is admitted (`Admission.place` chooses)
        self.queues.append(request)
        self.requests[request.request_id] = request
        self._pairs[request.key] += 1

    def pools_for(self, lane: str, num_prompt: int, max_tokens: int) -> tuple[Pool, ...]:
        """The caches a request of `lane` may be admitted to, in the order tried: each of its lane's
        (its own first: `layout.pools_for`) that holds its prompt and answer; else the first that
        holds its prompt and a token (its answer ends at that cache's edge); () when none does.
        Which of them it goes in is chosen when it is admitted, by the room each has then
        (`Admission.place`); its lane's priority and pace go with it."""
        lengths = self.max_seq_lens(lane)
        whole = tuple([p for p, n in lengths.items() if num_prompt + max_tokens <= n])
        if whole:
            return whole
        return next(((p,) for p, n in lengths.items() if num_prompt + 1 <= n), ())

    def pool_for(self, lane: str, num_prompt: int, max_tokens: int) -> Pool | None:
        """The first cache `pools_for` tries (the one whose room an answer is capped to: `Engine._check`,
        so the request's prompt and answer fit every cache it may go in); None when none holds it."""
        pools = self.pools_for(lane, num_prompt, max_tokens)
        return pools[0] if pools else None

    def max_seq_lens(self, lane: str) -> dict[Pool, int]:
        """The longest sequence each cache a request of `lane` may be read in holds, its own first."""
        return {p: self.max_seq_len(p) for p in self.layout.pools_for(self.lane(lane).interactive)}

    def max_seq_len(self, pool: Pool) -> int:
        """The longest sequence (prompt and answer) `pool` holds: its cells, or the model's context if less."""
        cells, cap = self.pools.kv[pool].num_cells, self.limits.max_seq_len
        return min(cells, cap) if cap else cells

    @property
    def running(self) -> list[Request]:
        """Generating sequences holding cells, in admission order."""
        return self.pools.running

    @property
    def embedding(self) -> list[Request]:
        """Embedding inputs holding cells, not yet done."""
        return self.pools.embedding

    def abort(self, request_id: str, reason: str = "abort", now: float | None = None) -> Request | None:
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is Status.WAITING:
            self.queues.remove(request)
        output = request.output_tokens
        if output and output[-1] == PENDING:  # its token was never read (a step settled `ahead`): nor charged
            output.pop()
            self._charge_output(request, -1.0)
        self._finish(request, reason, now)
        return request

    def finish(self, request_id: str, reason: str, now: float | None = None) -> None:
        """End a request for a reason found outside (a stop string)."""
        request = self.requests.get(request_id)
        if request is not None and not request.finished:
            self._finish(request, reason, now)

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.embedding) or any(self.waiting.values())

    def has_interactive_work(self) -> bool:
        return (any(r.interactive for r in self.running)
                or any(q for lane, q in self.waiting.items() if self.policies[lane].interactive))

    def typical_output(self, lane: str) -> float:
        """The lane's typical output length, as admission costs its readers (learnt from finished requests)."""
        return self.pacing.typical[lane]

    def reading_pace(self, lane: str) -> float | None:
        """The inter-token time an interactive lane's readers are held to on this machine: its
        target, or more where one reader's step alone takes most of it (None for background)."""
        policy = self.policies[lane]
        return self.pacing.pace(self.cost, policy.itl_target_ms) if policy.interactive else None

    def num_waiting(self, lane: str) -> int:
        return len(self.waiting[lane])

    def next_wakeup(self, now: float) -> float | None:
        """When a waiting request becomes eligible, if nothing can run before then. In a lane in
        arrival order (`queues.py`) the preempted requests stand first and the first of the rest
        becomes eligible first, so the rest are not looked at."""
        times: list[float] = []
        for lane, queue in self.waiting.items():
            ordered = self.queues.in_arrival_order(lane)
            for r in queue:
                if r.num_preemptions:
                    times.append(r.arrival_time)
                    continue
                times.append(self._eligible_at(lane, r.arrival_time))
                if ordered:
                    break
        return min(times, default=None)

    # ---- a request's lifecycle: the one owner of its status ------------------------------
    # WAITING in its lane's queue -> RUNNING holding a sequence (`_start`) -> back to WAITING when
    # preempted (`_requeue`), or FINISHED (`_finish`). Nothing else writes `Request.status`.

    def _start(self, request: Request, now: float) -> None:
        """A waiting request admitted (`Admission`): its sequence, from any prefix it reuses."""
        self.queues.remove(request)
        self.pools.admit(request)
        request.status = Status.RUNNING
        request.admitted_time = request.admitted_time or now
        reused = request.num_computed_tokens  # found in the prompt cache: never charged to fair share
        request.num_charged_prompt = max(request.num_charged_prompt, min(reused, request.num_prompt_tokens))
        if not request.num_preemptions:
            request.num_cached_tokens = reused

    def _preempt(self, request: Request, plan: StepPlan | None) -> None:
        """Drop a request's KV and requeue it at the head of its lane, keeping its output."""
        self.pools.preempt(request)
        self._requeue(request, plan)

    def _requeue(self, request: Request, plan: StepPlan | None) -> None:
        """A preempted request (its KV dropped) goes back to the head of its lane's queue."""
        if plan is not None:  # preempted while the step is planned: its tokens go too
            batch = plan.batches[request.pool]
            batch[:] = [i for i in batch if i.request_id != request.request_id]
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.queues.appendleft(request)

    def _finish(self, request: Request, reason: str, now: float | None) -> None:
        self.pools.release(request)
        if request.kind is Kind.GENERATE and reason in ("stop", "length"):
            self.pacing.learn(request)
        request.status, request.finish_reason = Status.FINISHED, reason
        request.finish_time = now if now is not None else self._clock
        self._done.append(request.request_id)
        self.drafting.forget(request.request_id)
        if self.requests.pop(request.request_id, None) is not None:
            self._pairs[request.key] -= 1
            if not self._pairs[request.key]:
                del self._pairs[request.key]

    # ---- KV growth, and who gives way -------------------------------------------------

    def _grow(self, request: Request, num_cells: int, plan: StepPlan | None) -> bool:
        """Make room for a request's next tokens, preempting if its pool is full (an over-share member
        first; background at its floor only when no interactive sequence can give way)."""
        spare = self._background_floor
        if not self.admission.members.make_room(request, num_cells, lambda r: self._preempt(r, plan), spare):
            return False
        grown, preempted = self.pools.grow(request, num_cells, spare)
        for r in preempted:
            self._requeue(r, plan)
        return grown

    def _grow_decodes(self, decoding: list[Request], plan: StepPlan) -> None:
        """A cell for each decode's token: all at once when the free cells cover them, else one
        at a time, each growth maybe preempting (the ones placed after it, or itself)."""
        if self.pools.grow_decodes(decoding):
            return
        for request in decoding:
            if request.status is Status.RUNNING:  # an earlier one may have preempted it (and dropped its item)
                self._grow(request, request.num_computed_tokens + 1, plan)  # may preempt, itself included

    def _background_floor(self, request: Request) -> bool:
        """`request` is background, which is down to its minimum share: it keeps its cells."""
        return not request.interactive and not self.share.may_preempt()

    def _slot_victim(self) -> Request | None:
        """Who gives way after llama.cpp found no KV slot: the lowest-priority, latest-admitted
        sequence, but an interactive one before background at its floor."""
        return self.pools.victim(spare=self._background_floor)
