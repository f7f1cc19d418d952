"""The iteration-level scheduler: pure, deterministic, the clock an argument.

There is no prefill phase and no decode phase. Each request has `num_computed_tokens`
catching up with `num_tokens`; a step gives each chosen request some tokens:

1. one decode token for every running sequence (interactive first), never skipped, except
   that background decodes in a cache of their own wait while an interactive prompt is read
   or a held output (read whole: a tool call) is written, down to background's minimum share
   (`share.py`);
2. prefill chunks with what is left of the step's token budget (`pacing.py`): interactive
   lanes first (with a share kept for background work when it is backlogged), then
   background lanes, each class ordered by token-aware fair share over (lane, member) pairs;
   a held output keeps steps short, and a step sampling an interactive first token carries
   background only within `held_step` times its own cost (`placement.py`);
3. embedding inputs compete with prefill chunks in the background class; they are chunked
   too (the embedding context keeps each input's cells until it is done, and the runner
   pools across chunks), unless the embedding model cannot (an encoder without a KV cache).

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
Every rule of a step reads one `Step`, built once when the step begins (`step.py`); a hold on
background (a voice turn's pause) is an input to `schedule()`. A `Policy` may change the candidates' order,
admission and the budget (the benchmark's baselines do).

Accounting follows what ran (as vLLM v1's `update_from_output`): `schedule()` only plans; the
tokens computed, fair share's charges and background's credit are settled in `update()` from
the plan that ran. A step that found no KV slot settles none of it, nor does one that raised
(`fail()`: its requests end with an error). A request's status has one writer: the lifecycle
methods here (`_start`, `_requeue`, `_finish`).

A step may also be settled in two halves, so that the next one is planned while it computes
(the engine's plan-ahead, for a GPU that returns from `llama_decode` before the logits are read):
`ahead()` settles what does not depend on the samples and holds each sampled token's place with
PENDING; `settle()` writes the tokens there (and into the next plan's items), ends a request
that sampled an end of generation, and teaches the cost model the step's time. The next step
is then planned one step late on those ends and that time; `prune()` drops from it whatever
ended before it runs.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable, NamedTuple

from homeai.sched.admission import Admission
from homeai.sched.costmodel import StepCostModel, StepShape
from homeai.sched.fairshare import FairShare
from homeai.sched.layout import cache_layout
from homeai.sched.pacing import Pacing
from homeai.sched.placement import Placement, decode_item
from homeai.sched.plan import Output, ScheduledItem, StepPlan, StepResult, new_tuple
from homeai.sched.policy import HOMEAI, Policy
from homeai.sched.pools import GENERATE, KVPools, Pool, PromptCache
from homeai.sched.prefix import Memory
from homeai.sched.queues import WaitingQueues
from homeai.sched.request import GENERATE_KIND, RUNNING, WAITING, Kind, Request, Sample, Status
from homeai.sched.share import BackgroundShare
from homeai.sched.step import Admissions, Moment, Step
from homeai.sched.window import eligible_at
from lanes.base import LanePolicy

_NUM_COMPUTED = attrgetter("num_computed_tokens")
_REQUEST_ID = attrgetter("request_id")
FINISHED = Status.FINISHED  # (a plain name: see `request.RUNNING`)
PENDING = -1  # a sampled token's place while the step that samples it computes (`ahead`)


class Pending(NamedTuple):
    """A sampled row of a step settled ahead: its request, the position its token takes, and whether
    `ahead` ended the request already (the row is its last token: "length", or an embedding input's)."""

    request: Request
    position: int
    ended: bool


__all__ = ["NoRoom", "Output", "QueueFull", "ScheduledItem", "Scheduler", "SchedulerLimits", "StepPlan",
           "StepResult", "UnknownLane"]


class UnknownLane(ValueError):
    """A lane with no policy: the one check that a lane exists (`Scheduler.lane`)."""

    def __init__(self, lane: str, known):
        super().__init__(f"unknown lane {lane!r} (known: {', '.join(known)})")
        self.lane = lane


class QueueFull(Exception):
    """A lane's queue is at its maximum; the caller should retry later (HTTP 429)."""

    def __init__(self, lane: str, max_queue: int):
        super().__init__(f"lane {lane!r} queue is full ({max_queue} waiting); retry later")
        self.lane, self.max_queue = lane, max_queue


class NoRoom(ValueError):
    """A sequence longer than any cache its lane may use holds (the engine refuses it first, saying
    how many tokens fit where: `Scheduler.max_seq_len`)."""

    def __init__(self, lane: str, num_tokens: int):
        super().__init__(f"no cache of lane {lane!r} holds a sequence of {num_tokens} tokens")


@dataclass(frozen=True)
class SchedulerLimits:
    num_cells: int  # KV cells of the generation context
    num_seqs: int  # sequence ids of the generation context
    max_step_tokens: int  # the most tokens one step may carry (llama.cpp's n_batch)
    embed_max_tokens: int  # cells of the embedding context: the most embedding tokens in flight
    embed_max_seqs: int  # sequence ids of the embedding context: the most inputs in flight
    w_in: float = 1.0
    w_out: float = 2.0
    background_min_share: float = 0.1
    min_chunk: int = 16
    max_step_ms: float = 120.0
    embed_chunked: bool = True  # the embedding model keeps a KV cache, so an input may span steps
    # Cells of a second KV cache for the interactive lanes (0: every lane shares the one cache),
    # with num_seqs sequence ids of its own.
    interactive_cells: int = 0
    # A lane's typical output length until its own finished requests teach the scheduler better:
    # admission costs readers at their typical length, not at the length they have now.
    typical_output: int = 64
    # Keep finished sequences' cells as cached prefixes a later request may start from, up to
    # `prompt_cache_max_cells` a pool (0: whatever the live sequences leave free).
    prompt_cache: bool = False
    prompt_cache_max_cells: int = 0
    member_seq_share: float = 0.5  # the most of the interactive readers one member holds while others wait
    prompt_cache_shared: bool = False  # every member reuses every member's prefixes (else: per member, `prefix.py`)
    max_seq_len: int = 0  # the longest sequence the model takes (its training context); 0: any a cache holds


class Scheduler:
    def __init__(self, policies: dict[str, LanePolicy], limits: SchedulerLimits, policy: Policy = HOMEAI,
                 memory: Memory = Memory()):
        """`memory`: where the model's sequences may be resumed (the runner's `kv_memory`; a plain cache's by default)."""
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

    # ---- the plan ------------------------------------------------------------------

    def schedule(self, now: float, hold_background: bool = False) -> StepPlan:
        """The next step. `hold_background`: background work waits (its cells kept) unless
        interactive work is there to run beside it (a voice turn's speech-to-text needs the cores)."""
        self._clock = now
        plan = StepPlan(next(self._steps))
        if hold_background and not self.has_interactive_work():
            return self._close(plan)
        self.fair.set_backlogged(self._pairs.keys())
        step, decoding = self._begin(now, plan)
        plan.budget_of = self._budget(step, step.decodes, len(decoding))
        version = self.pools.version
        self._grow_decodes(decoding, plan)
        usable = self._fill(step, plan)
        if usable is not None or step.deferred > 0:  # background is backlogged: owed its share, once the step ran
            interactive = {r.request_id for r in self.running if r.interactive}
            plan.background = self.share.due(plan, interactive, call_tokens=self.cost.call_tokens(),
                                             own_calls=self.layout.own_calls)
        else:
            self.share.forget()
        # Nothing placed beside the decodes and none of them dropped (a preemption changes the running
        # set): the plan is costed as its decodes were (most steps; a pass over the items else).
        alone = (self.pools.version == version and not plan.batches[Pool.EMBED]
                 and sum([len(plan.batches[pool]) for pool in GENERATE]) == len(decoding))
        plan.shape = step.decodes if alone else self.placement.shape(step, plan)
        self.share.waited_for_first = step.first_token_waits and self.placement.gives_first_token(step, plan)
        return self._close(plan)

    def _fill(self, step: Step, plan: StepPlan) -> int | None:
        """Prefill chunks and embedding inputs in what the decodes left of the budget (the policy's
        order, or the layout's). Returns how many tokens background could use (None: none of it is
        backlogged and eligible). With nothing waiting and no input part-read there is nothing to
        place (no candidate, no admission, no side effect), so the rules are not asked: the
        steady state of a few sequences decoding pays nothing here. Nor with none reading and every
        waiting request refused whatever its turn (`Admission.all_refused`: a full house)."""
        partial = step.reading(self.pools)
        if not partial and not any(self.waiting.values()):
            return None
        left = plan.budget - len(plan.generating)
        order = self.policy.order(partial, self.waiting)
        if order is not None:
            self.placement.fill_in_order(step, plan, order, left)
            return None
        usable = self.admission.background_usable(step, left)
        if partial or not self.admission.all_refused():  # (else every candidate would be refused: nothing to place)
            self.layout.fill(self.placement, step, plan, left, self.share.reserve(usable, left, step.min_chunk))
        return usable

    def _first_question(self) -> int | None:
        """The fewest prompt tokens left to read of an interactive request whose member has no
        answer decoding (a member's question, read first beside another member's readers); None:
        there is none. The waiting ones' are kept per pair (`WaitingQueues.shortest_fresh`)."""
        decoding: set[str] = set()  # members with an answer decoding
        reading: list[Request] = []  # interactive sequences with no output yet
        for r in self.running:
            if r.interactive:
                if r.output_tokens:
                    decoding.add(r.member)
                else:
                    reading.append(r)
        left = [r.num_remaining for r in reading if r.member not in decoding]
        for lane, pairs in self.queues.pairs.items():
            if self.policies[lane].interactive:
                left += [n for member in pairs if member not in decoding
                         and (n := self.queues.shortest_fresh(lane, member)) is not None]
        return min(left, default=None)

    def _close(self, plan: StepPlan) -> StepPlan:
        plan.cache_ops, plan.done, self._done = self.pools.take_ops(), self._done, []
        return plan

    def _begin(self, now: float, plan: StepPlan) -> tuple[Step, list[Request]]:
        """The step's facts, built once, with its decodes placed in `plan`; and the sequences decoding."""
        # Only lanes with requests waiting: one queued later in the step was preempted (always eligible).
        waiting = self.waiting
        cutoffs = ({lane: now - self._eligible_at(lane, 0.0) for lane, queue in waiting.items() if queue}
                   if any(waiting.values()) else {})
        moment = Moment(now, self.cost, cutoffs, Admissions())
        if cutoffs:  # (with nothing waiting no member is kept out of a reader slot: `members.py`)
            self.admission.rebalance(moment, self._preempt)
        decoding_now, reading_now = moment.running(self.pools)
        # Nothing waits and nothing reads its input (answers decoding, most steps): no admission
        # rule, lateness or first question has anything to look at.
        quiet = not cutoffs and not reading_now and not self.pools.embedding
        readers = [r for r in decoding_now if r.interactive]
        decoding = readers + [r for r in decoding_now if not r.interactive]  # interactive first
        # An interactive output read whole (a tool call being written) is short, and its client
        # waits for all of it: nothing background is overdue meanwhile (it is owed its share after).
        held = any([r.held for r in readers])  # (a list: a generator resumes once a reader)
        overdue = frozenset() if held or quiet else self.share.overdue(moment.reading(self.pools), self.waiting, now)
        began_idle = not self.running
        prompt = not quiet and self.admission.prompt_can_go(moment)
        background = len(decoding) - len(readers)
        deferred = 0
        # Interactive lanes with a cache of their own take whole steps while one of them reads a
        # prompt or writes a held output: background decodes would cost a second decode call each step.
        if (prompt or held) and self.layout.background_decodes_wait(self.share, background, self.cost.call_tokens()):
            decoding, deferred = readers, background
        num_decoding = dict.fromkeys(GENERATE, 0)
        cells = {pool: self.pools.cells_cached(pool) if pool in self.pools.kv else 0 for pool in GENERATE}
        if len(self.pools.generating) == 1:  # one cache for every sequence (most homes): no sorting by pool
            pool = self.pools.generating[0]
            plan.batches[pool] += map(decode_item, decoding)
            num_decoding[pool] = len(decoding)
            context = sum(map(_NUM_COMPUTED, self.running))
            cells[pool] += context
        else:
            for r in decoding:
                plan.batches[r.pool].append(decode_item(r))
                num_decoding[r.pool] += 1
            context = 0
            for r in self.running:
                cells[r.pool] += r.num_computed_tokens
                context += r.num_computed_tokens
        plan.context_cells += context
        lanes = {r.lane for r in readers}
        pace = self.pacing.pace(self.cost, min(self.policies[lane].itl_target_ms for lane in lanes)) if lanes else None
        lone = not decoding_now
        decodes = plan.decodes_shape(num_decoding, cells)  # the plan holds its decodes alone so far
        aim = self._aim(pace, lone, held, decodes, cells, quiet)
        # The moment's fields, then the step's own, in their order (by position: naming them cost ~6k
        # instructions more a step): overdue, began_idle, prompt, cells, num_decoding, decodes, deferred,
        # pace, aim, lone, held, first_token_waits, min_chunk.
        step = Step(moment.now, moment.cost, moment.cutoffs, moment.admissions, overdue, began_idle, prompt, cells,
                    num_decoding, decodes, deferred, pace, aim, lone, held, prompt and not self.share.waited_for_first,
                    self.pacing.min_chunk_for(pace))
        return step, decoding

    def _aim(self, pace: float | None, lone: bool, held: bool, decodes: StepShape, cells: dict[Pool, int],
             quiet: bool) -> float:
        """The step's time target: its readers' (or throughput's), shorter while a held output is
        written, longer while members' first questions are read (`quiet`: none is)."""
        aim = self.pacing.aim(pace, lone)
        if held:
            return self.pacing.held_aim(aim, self.cost, decodes)
        if pace is None or quiet:
            return aim  # first questions are read faster only beside readers
        return self.pacing.first_read_aim(aim, pace, self.cost, decodes, cells[self.pools.of_class(True)],
                                          self._first_question())

    def _budget(self, step: Step, decodes: StepShape, num_decoding: int) -> Callable[[], int]:
        """Tokens this step may carry, as a sum to do when asked; prefill goes first to interactive
        lanes, so it is costed in their cache when they have their own."""
        fixed = self.policy.budget(self.limits.max_step_tokens)
        if fixed is not None:
            return lambda: fixed
        to = self.pools.of_class(step.prompt)
        # (by position: num_decoding, decodes, pace, aim, cells, new_decode, prompt, way_back)
        return self.pacing.budget(step.cost, num_decoding, decodes, step.pace, step.aim, step.cells[to],
                                  not step.num_decoding[to], step.prompt, self.share.way_back(step.overdue))

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

    # ---- results -------------------------------------------------------------------

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[Output]:
        """What the step did: every token, fair-share charge and background payment is settled
        here, from the plan that ran (`_settle`, the samples known); a step that found no KV slot
        settles nothing."""
        self._clock = now
        if result.no_kv_slot:  # nothing was kept: shrink, and free room
            self.pacing.no_kv_slot()  # embedding chunks did not run either: they go again
            victim = self._slot_victim()
            if victim is not None and len(self.running) > 1:
                self._preempt(victim, None)
            self.pools.drop_cached()  # cached prefixes too: the room must be real, in llama.cpp's cache
            return []
        self._observe(plan, result, now)  # (before `_settle`: the prompt cache's expiry reads the cost model)
        return self._settle(plan, now, result)

    # ---- a step settled in two halves (the next one planned while it computes) ----------

    def ahead(self, plan: StepPlan, now: float) -> list[Pending]:
        """`update()` before the samples are read (`_settle`, without them): every token of the step
        computed, fair share charged (each sampled row's output token too), background's credit
        settled; each sampled row's place in its request's output holds PENDING; a request at its
        last token ends here, as update() ends it. Returns the sampled rows, for `settle`."""
        return self._settle(plan, now, None)

    def settle(self, plan: StepPlan, pending: list[Pending], result: StepResult, now: float,
               next_plan: StepPlan | None) -> list[Output]:
        """The samples of a step `ahead()` settled: each token written where PENDING held its place
        (in the request, and in `next_plan`'s items, planned meanwhile); an end of generation ends
        its request ("stop", its output charge given back, its items dropped from `next_plan`), as
        update() would have ended it; the step's time taught to the cost model."""
        self._observe(plan, result, now)
        self._clock = now
        outputs: list[Output] = []
        samples = result.samples
        planned: dict[str, ScheduledItem] | None = None  # next_plan's items by request, once one is patched
        for request, position, ended in pending:
            if request.kind is not GENERATE_KIND:  # an embedding input's last chunk
                outputs.append(_embedded(request, result, now))
                continue
            if request.status is FINISHED and not ended:
                continue  # aborted while the step computed
            sample = samples[request.request_id]
            request.sampled_at(now)
            if sample.is_eog:
                self._ended_late(request, ended, now, next_plan)
                outputs.append(new_tuple(Output, (request, None, True)))
                continue
            token = request.output_tokens[position - len(request.prompt_tokens)] = sample.token
            if request.params.record_logits:  # (its rows' scores: kept for evaluation, read by nothing else)
                request.samples.append(sample)
            if ended:
                request.finish_time = now
            elif next_plan is not None:
                if planned is None:
                    items = next_plan.generating
                    planned = dict(zip(map(_REQUEST_ID, items), items))
                item = planned.get(request.request_id)
                if item is not None:
                    start, tokens = item[3], item[4]  # (a named tuple's fields by index: every sequence, every step)
                    if start <= position < start + len(tokens):
                        tokens[position - start] = token
            outputs.append(new_tuple(Output, (request, sample, ended)))
        return outputs

    def _observe(self, plan: StepPlan, result: StepResult, now: float) -> None:
        if not plan.empty:
            self.cost.observe(plan.shape, result.elapsed_ms, now)

    def _settle(self, plan: StepPlan, now: float, result: StepResult | None) -> list:
        """The one settlement of a step that ran: its tokens computed, fair share's charges (each
        sampled row's output token's too), background's credit, the prompt cache's aging; a request
        at its last token ended ("length"), an embedding input at its last chunk ("stop").

        With `result` (`update`), each sampled row's token is written and timed, an end of generation
        ends its request ("stop", uncharged), and the step's outputs are returned. Without it
        (`ahead`: the samples are not read yet), each sampled row's place in its output is held by
        PENDING and charged, and the sampled rows are returned, for `settle`. (One pass over the
        items: it runs for every sequence every step, so what it reads is looked up once, not once
        an item.)"""
        self._clock = now
        self.pacing.step_ran()
        if plan.background is not None:
            self.share.settle(plan.background)
        if not plan.empty:
            for pool in self.pools.cache:  # the prompt cache's pools: their prefixes age by the step's work
                self.pools.computed(pool, sum([len(i.tokens) for i in plan.batches[pool]]))
            self.pools.expire(self.cost.tokens_per_kcell())
        settled: list = []  # the outputs (with `result`), else the sampled rows (`Pending`)
        samples = result.samples if result is not None else None
        requests, policies, counters = self.requests, self.policies, self.fair.counters
        output_cost: dict[str, float] = {}  # per lane: fair share's charge for one output token
        for item in plan.generating:
            request_id, _, seq_id, start, tokens, sampled, _, _ = item
            request = requests.get(request_id)
            if request is None or request.status is not RUNNING or request.seq_id != seq_id:
                continue  # aborted or preempted while the step ran (or was planned)
            if request.num_charged_prompt < len(request.prompt_tokens):  # else nothing to charge (a decode's case)
                self._charge_prompt(request, item)
            request.num_computed_tokens = start + len(tokens)
            if not sampled:
                continue
            if samples is None:
                token = PENDING
            else:
                sample = samples[request_id]
                last = request.last_token_time  # `request.sampled_at(now)`, inlined (every sequence, every step)
                if request.first_token_time is None:
                    request.first_token_time = now
                elif last is not None:
                    request.itls.append(now - last)
                request.last_token_time = now
                if sample.is_eog:
                    self._finish(request, "stop", now)
                    settled.append(new_tuple(Output, (request, None, True)))
                    continue
                token = sample.token
            output = request.output_tokens
            output.append(token)
            lane, params = request.lane, request.params
            cost = output_cost.get(lane)
            if cost is None:
                cost = output_cost[lane] = self.fair.output_cost(policies[lane].weight)
            key = (lane, request.member)  # `fair.charge_output`, inlined
            counters[key] = counters.get(key, 0.0) + cost
            forced = params.forced_tokens  # `request.max_tokens`, inlined
            ended = len(output) >= (params.max_tokens if forced is None else len(forced))
            if ended:
                self._finish(request, "length", now)
            if samples is None:
                settled.append(new_tuple(Pending, (request, len(request.prompt_tokens) + len(output) - 1, ended)))
            else:
                if params.record_logits:
                    request.samples.append(sample)
                settled.append(new_tuple(Output, (request, sample, ended)))
        for item in plan.batches[Pool.EMBED]:
            request = requests.get(item.request_id)
            if request is None or request.finished or request.seq_id != item.seq_id:
                continue
            self._charge_prompt(request, item)
            request.num_computed_tokens = item.start + len(item.tokens)
            if item.sample:  # its last chunk: its vector is the result's (read in `settle`, when ahead)
                self._finish(request, "stop", now)
                settled.append(Pending(request, 0, True) if result is None else _embedded(request, result, now))
        return settled

    def _ended_late(self, request: Request, ended: bool, now: float, next_plan: StepPlan | None) -> None:
        """An end of generation sampled in a step settled ahead: the request ends "stop" as update()
        would have ended it, without the token's place or its output charge, and leaves the plan
        made meanwhile (preempted by it, it leaves its queue)."""
        request.output_tokens.pop()  # (its PENDING: nothing else is added while the step computes)
        self._charge_output(request, -1.0)
        if ended:  # `ahead` ended it at its last token: only the reason changes
            request.finish_reason, request.finish_time = "stop", now
            return
        if request.status is WAITING:
            self.queues.remove(request)
        self._finish(request, "stop", now)
        if next_plan is not None:
            batch = next_plan.batches[request.pool]
            batch[:] = [i for i in batch if i.request_id != request.request_id]

    def replan(self, plan: StepPlan, now: float, hold_background: bool = False) -> StepPlan:
        """A plan made ahead (decodes alone: `only_decoding`), made again because requests came
        since: a plan only plans (what ran is settled from the plan that ran), so the new one
        replaces it whole; only its cache operations and ended requests carry over, first."""
        fresh = self.schedule(now, hold_background)
        for pool, ops in plan.cache_ops.items():
            fresh.cache_ops[pool] = ops + fresh.cache_ops.get(pool, [])
        fresh.done = plan.done + fresh.done
        return fresh

    def only_decoding(self) -> bool:
        """Nothing waits and every running sequence decodes: the next step holds decodes alone,
        whenever it is planned. Only then does the engine plan it ahead, so that a request arriving
        meanwhile waits one decode step more, not a step of prompt chunks."""
        if self.embedding or any(self.waiting.values()):
            return False
        for r in self.running:  # `is_decoding`, inlined (every sequence, every step)
            if len(r.prompt_tokens) + len(r.output_tokens) - r.num_computed_tokens != 1 or not r.output_tokens:
                return False
        return True

    def prune(self, plan: StepPlan) -> None:
        """Drop from a plan made ahead the items of requests that ended since (an abort, a stop
        string, an end of generation): only what still holds its sequence runs."""
        if not self._done:
            return
        requests = self.requests
        for batch in plan.batches.values():
            if batch:
                batch[:] = [i for i in batch if (r := requests.get(i.request_id)) is not None and r.seq_id == i.seq_id]

    def _charge_output(self, request: Request, n: float) -> None:
        key = (request.lane, request.member)
        counters = self.fair.counters
        counters[key] = counters.get(key, 0.0) + n * self.fair.output_cost(self.policies[request.lane].weight)

    def _charge_prompt(self, request: Request, item: ScheduledItem) -> None:
        """Fair share's charge for the prompt tokens a chunk that ran read (a recompute is free)."""
        end = min(item.start + len(item.tokens), request.num_prompt_tokens)
        fresh = end - request.num_charged_prompt
        if fresh > 0:
            request.num_charged_prompt = end
            self.fair.charge(request.key, weight=self.policies[request.lane].weight, num_in=fresh)

    def fail(self, plan: StepPlan, now: float) -> list[Request]:
        """The step raised: nothing of it is settled (no token computed, no fair-share charge, no
        background payment), and its requests end with "error". Returns those still in flight."""
        ended = (self.abort(i.request_id, "error", now) for i in plan.items)
        return [r for r in ended if r is not None]

    def _eligible_at(self, lane: str, arrival: float) -> float:
        return eligible_at(self.policies[lane], arrival, engine_busy=bool(self.running),
                           num_queued=len(self.waiting[lane]))


def _embedded(request: Request, result: StepResult, now: float) -> Output:
    """An embedding input's last chunk ran (its request ended "stop"): its vector, out."""
    request.embedding = result.embeddings.get(request.request_id)
    request.first_token_time = request.finish_time = now
    return Output(request, None, True)
