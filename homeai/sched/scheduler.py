"""The iteration-level scheduler: pure, deterministic, the clock an argument.

There is no prefill phase and no decode phase. Each request has `num_computed_tokens`
catching up with `num_tokens`; a step gives each chosen request some tokens:

1. one decode token for every running sequence (interactive first), never skipped, except
   that with a separate interactive cache background decodes wait while an interactive
   prompt is read (down to background's minimum share, where a decode call of its own
   costs background its fixed cost in tokens' worth);
2. prefill chunks with what is left of the step's token budget: interactive lanes first
   (with a share kept for background work when it is backlogged), then background lanes,
   each class ordered by token-aware fair share over (lane, member) pairs;
3. embedding inputs compete with prefill chunks in the background class; they are chunked
   too (the embedding context keeps each input's cells until it is done, and the runner
   pools across chunks), unless the embedding model cannot (an encoder without a KV cache),
   where an input is atomic.

The budget adapts to a step-cost model: while an interactive lane decodes, a step is kept
within its inter-token-latency target; otherwise it grows for throughput. An interactive
request is admitted only while the readers, costed at their lane's typical output length
(learnt from finished requests), keep that pace with room left to read its prompt. KV
admission reserves cells. With one cache for every lane, an interactive request that cannot be
admitted preempts the lowest-priority, latest-admitted background sequence by recompute.
With a cache of their own (`interactive_cells`), interactive lanes never take background
cells, and their tokens never attend over them.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from homeai.sched.costmodel import StepCostModel, StepShape
from homeai.sched.fairshare import FairShare
from homeai.sched.kv import KVManager
from homeai.sched.request import Kind, Request, Sample, SamplingParams, Status
from homeai.sched.window import eligible_at
from lanes.base import LanePolicy


# While interactive lanes decode, a step aims at STEP_AIM of their inter-token target (the cost
# model's error and the machine's noise land on both sides of it), and readers are admitted
# only while their decodes, at typical length, take at most READERS_AIM of it: the rest of
# the aim reads new prompts.
STEP_AIM = 0.8
READERS_AIM = 0.7
# On a machine too slow for that target (a large model on a CPU: one reader's decode alone
# takes most of it), readers share the steps anyway rather than wait for each other to
# finish: each is held to no slower than SHARED_PACE times the step one reader takes alone.
SHARED_PACE = 2.0


class QueueFull(Exception):
    """A lane's queue is at its maximum; the caller should retry later (HTTP 429)."""

    def __init__(self, lane: str, max_queue: int):
        super().__init__(f"lane {lane!r} queue is full ({max_queue} waiting); retry later")
        self.lane, self.max_queue = lane, max_queue


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
    # Cells of a second KV cache for the interactive lanes (0: every lane shares the one cache).
    # Its sequence ids follow the first cache's: num_seqs .. 2 * num_seqs - 1.
    interactive_cells: int = 0
    # A lane's typical output length until its own finished requests teach the scheduler better:
    # admission costs readers at their typical length, not at the length they have now.
    typical_output: int = 64


class _Readers(NamedTuple):
    n: int  # interactive sequences running
    priority: int  # the best (lowest) priority among them
    target: float  # the tightest inter-token target among them (ms)
    cells: int  # their cells at their typical length
    background: int  # background sequences decoding
    background_cells: int  # the cells background holds


@dataclass(frozen=True)
class ScheduledItem:
    request_id: str
    kind: Kind
    seq_id: int | None  # for embeddings, a sequence of the embedding context
    start: int  # position of the first token
    tokens: list[int]
    sample: bool  # a token is sampled after this chunk
    params: SamplingParams | None = None  # the runner builds the request's sampler from these
    forced: int | None = None  # teacher forcing: the token to output instead of sampling


@dataclass
class StepPlan:
    step_id: int
    items: list[ScheduledItem] = field(default_factory=list)  # generation: one llama_decode
    embed_items: list[ScheduledItem] = field(default_factory=list)
    release: list[int] = field(default_factory=list)  # seq ids whose KV to drop before decoding
    embed_release: list[int] = field(default_factory=list)  # the same, in the embedding context
    done: list[str] = field(default_factory=list)  # requests whose sampler state may go
    budget: int = 0
    context_cells: int = 0  # KV cells holding context when the step was planned
    shape: StepShape = StepShape(0)  # what the cost model costs: decode calls, tokens, attention, outputs

    @property
    def num_outputs(self) -> int:
        return sum(1 for i in self.items if i.sample)

    @property
    def num_tokens(self) -> int:
        return sum(len(i.tokens) for i in self.items) + sum(len(i.tokens) for i in self.embed_items)

    @property
    def empty(self) -> bool:
        return not self.items and not self.embed_items


@dataclass
class StepResult:
    samples: dict[str, Sample] = field(default_factory=dict)
    embeddings: dict[str, object] = field(default_factory=dict)
    elapsed_ms: float = 0.0
    no_kv_slot: bool = False  # llama_decode found no KV slot: nothing of this step was kept


@dataclass(frozen=True)
class Output:
    request: Request
    sample: Sample | None  # the new token, if one was sampled
    finished: bool


class Scheduler:
    def __init__(self, policies: dict[str, LanePolicy], limits: SchedulerLimits):
        self.policies = policies
        self.limits = limits
        self.kv = KVManager(limits.num_cells, limits.num_seqs)  # every lane's, or background's when split
        self.split = limits.interactive_cells > 0
        self.interactive_kv = (KVManager(limits.interactive_cells, limits.num_seqs, first_id=limits.num_seqs)
                               if self.split else self.kv)
        self.embed_kv = KVManager(limits.embed_max_tokens, limits.embed_max_seqs)
        self.embedding: list[Request] = []  # embedding inputs admitted and not yet done
        self.fair = FairShare(limits.w_in, limits.w_out)
        self.cost = StepCostModel()
        self.waiting: dict[str, deque[Request]] = {name: deque() for name in policies}
        self.running: list[Request] = []  # in admission order
        self.requests: dict[str, Request] = {}
        self._release: list[int] = []
        self._embed_release: list[int] = []
        self._done: list[str] = []
        self._steps = itertools.count()
        self._bg_credit = 0.0  # deficit counter: background tokens owed under interactive load
        self._shrink = 1.0  # < 1 after llama.cpp found no KV slot
        self._min_chunk = limits.min_chunk  # this step's smallest prefill chunk worth placing
        self._plan: StepPlan | None = None  # the plan being built, while schedule() runs
        self._num_decoding = {True: 0, False: 0}  # per class, sequences decoding in its cache this step
        self._cells = {True: 0, False: 0}  # per class, cells holding context in its cache
        self._aim = 0.0  # this step's time target (ms)
        self._deferred = 0  # background decodes waiting this step for an interactive prompt
        self._failed_need = {True: math.inf, False: math.inf}  # per class, the smallest refused admission
        self._cutoffs: dict[str, float] = {}  # per lane, the arrival time eligible this step
        self._typical_output = {name: float(limits.typical_output) for name in policies}  # learnt per lane
        self._readers_now: _Readers | None = None  # admission's view of the running set, this step
        self._overdue: set[str] = set()  # lanes served this step whatever the cost model says

    # ---- requests in and out -------------------------------------------------------

    def add_request(self, request: Request) -> None:
        policy = self.policies.get(request.lane)
        if policy is None:
            raise ValueError(f"unknown lane {request.lane!r} (known: {', '.join(self.policies)})")
        queue = self.waiting[request.lane]
        if len(queue) >= policy.max_queue:
            raise QueueFull(request.lane, policy.max_queue)
        queue.append(request)
        self.requests[request.request_id] = request

    def abort(self, request_id: str, reason: str = "abort", now: float | None = None) -> Request | None:
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is Status.WAITING:
            self.waiting[request.lane].remove(request)
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
        return (any(self.policies[r.lane].interactive for r in self.running)
                or any(q for lane, q in self.waiting.items() if self.policies[lane].interactive))

    def typical_output(self, lane: str) -> float:
        """The lane's typical output length, as admission costs its readers (learnt from finished requests)."""
        return self._typical_output[lane]

    def reading_pace(self, lane: str) -> float | None:
        """The inter-token time an interactive lane's readers are held to on this machine: its
        target, or more where one reader's step alone takes most of it (None for background)."""
        policy = self.policies[lane]
        return self._pace(policy.itl_target_ms) if policy.interactive else None

    def num_waiting(self, lane: str) -> int:
        return len(self.waiting[lane])

    def next_wakeup(self, now: float) -> float | None:
        """When a waiting request becomes eligible, if nothing can run before then."""
        times = [self._eligible_at(r) for q in self.waiting.values() for r in q]
        return min(times, default=None)

    # ---- the plan ------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        self._now = now
        self._readers_now = None
        plan = self._plan = StepPlan(step_id=next(self._steps))
        self.fair.set_backlogged({r.key for r in self.requests.values()})
        decoding = sorted((r for r in self.running if r.is_decoding),
                          key=lambda r: not self.policies[r.lane].interactive)
        decoding = self._decoding_now(decoding, now)
        self._failed_need = {True: math.inf, False: math.inf}
        self._cutoffs = {}
        self._overdue = self._overdue_lanes(now)
        cells, num_decoding = {True: 0, False: 0}, {True: 0, False: 0}
        for r in self.running:  # per cache: the interactive lanes' own, if split, else one for all
            cells[self.split and self.policies[r.lane].interactive] += r.num_computed_tokens
        for r in decoding:  # decoding this step (background ones may be waiting)
            num_decoding[self.split and self.policies[r.lane].interactive] += 1
        if not self.split:
            cells[True], num_decoding[True] = cells[False], num_decoding[False]
        self._cells = cells
        self._num_decoding = num_decoding
        plan.context_cells = sum(r.num_computed_tokens for r in self.running)
        plan.budget = self._budget(decoding, now)
        for request in decoding:
            if request.status is Status.RUNNING:  # an earlier one may have preempted it
                self._grow(request, request.num_computed_tokens + 1)  # may preempt, itself included
        plan.items = [self._item(r, 1) for r in decoding if r.status is Status.RUNNING]
        left = plan.budget - len(plan.items)
        usable = self._background_usable(now, left)
        reserve = self._background_reserve(usable, left)
        if self.split:
            self._fill_split(plan, now, left, reserve)
        else:
            used = self._fill(plan, now, interactive=True, budget=left - reserve)
            used += self._fill(plan, now, interactive=False, budget=max(left - used, reserve))
            if reserve and used < left:  # background left part of its reserve: interactive work takes it
                self._fill(plan, now, interactive=True, budget=left - used)
        self._settle_background_credit(plan, backlogged=usable is not None or self._deferred > 0)
        plan.shape = self._shape(plan.items, plan.embed_items)
        plan.release, plan.embed_release, plan.done = self._release, self._embed_release, self._done
        self._release, self._embed_release, self._done, self._plan = [], [], [], None
        return plan

    def _decoding_now(self, decoding: list[Request], now: float) -> list[Request]:
        """With a cache of their own, interactive lanes take whole steps while one of them reads a
        prompt: background decodes would cost a second decode call each step. They wait (their
        cells kept) until background's minimum share owes them a step."""
        self._deferred = 0
        if not self.split or not self._interactive_prompt_can_go(now):
            return decoding
        background = [r for r in decoding if not self.policies[r.lane].interactive]
        if not background or self._bg_credit >= len(background) + self._call_tokens():
            return decoding
        self._deferred = len(background)  # owed their share like any backlogged background work
        return [r for r in decoding if self.policies[r.lane].interactive]

    def _overdue_lanes(self, now: float) -> set[str]:
        """Background lanes whose oldest request has waited for its first token (or embedding)
        half the lane's TTFT target.

        They get a step's minimum share whatever the cost model predicts: the model learns only
        from steps that run, so a fit a noisy neighbour made too slow must not stop the steps
        that would correct it. (Interactive lanes need no such way back: a reader's decode runs
        every step, and with no reader running a prompt is always let in.)"""
        late = {r.lane for r in [*self.running, *self.embedding]
                if not r.is_decoding and r.first_token_time is None and self._waited_too_long(r, now)}
        late.update(lane for lane, q in self.waiting.items() if q and self._waited_too_long(q[0], now))
        return {lane for lane in late if not self.policies[lane].interactive}

    def _waited_too_long(self, request: Request, now: float) -> bool:
        """Half its lane's TTFT target: served from then on, it still makes the target."""
        return now - request.arrival_time > self.policies[request.lane].ttft_target_ms / 2000.0

    def _share_tokens(self) -> int:
        """A step's minimum share, in tokens: what an overdue lane gets whatever the cost model says."""
        return max(self.limits.min_chunk, math.ceil(self.limits.background_min_share * self.limits.max_step_tokens))

    def _way_back(self) -> int:
        """Tokens a step carries beyond its decodes whatever the cost model predicts: a minimum
        share while a background lane is overdue, and background's credit once it is owed."""
        owed = self.limits.min_chunk if self._bg_credit >= self.limits.min_chunk else 0
        return max(self._share_tokens() if self._overdue else 0, owed)

    def _background_reserve(self, usable: int | None, left: int) -> int:
        """Tokens of this step kept for background work: what it is owed of its minimum share
        (a deficit counter, see `_settle_background_credit`), if it can use them this step."""
        if not usable or self._bg_credit < self._min_chunk:
            return 0
        return max(min(int(self._bg_credit), left, usable), 0)

    def _settle_background_credit(self, plan: StepPlan, backlogged: bool) -> None:
        """While background work is backlogged it is owed `background_min_share` of every step's
        tokens and is paid with the tokens it gets; an atomic embedding input larger than a step
        waits until the debt covers it (or no interactive work is running)."""
        if not backlogged:
            self._bg_credit = 0.0
            return
        background = [i for i in plan.items if not self.policies[self.requests[i.request_id].lane].interactive]
        got = sum(len(i.tokens) for i in background) + sum(len(i.tokens) for i in plan.embed_items)
        if self.split and len(background) < len(plan.items):  # beside interactive work, background's
            got += self._call_tokens() * ((len(background) > 0) + (len(plan.embed_items) > 0))  # calls are its own
        owed = self.limits.background_min_share * plan.num_tokens
        cap = max(self.limits.embed_max_tokens, self.limits.max_step_tokens)
        self._bg_credit = min(max(self._bg_credit + owed - got, 0.0), cap)

    def _call_tokens(self) -> float:
        """A decode call's fixed cost in tokens' worth: what background pays for a call of its own."""
        a, b, _, _ = self.cost.coefficients
        return a / b

    def _budget(self, decoding: list[Request], now: float) -> int:
        """Tokens this step may carry, as the cost model predicts them over the cells in use.

        While an interactive lane decodes, the step is kept within its aim (below its inter-token
        target), and any prefill chunk that fits rides along (however small: the step's fixed
        cost is paid anyway). Admission keeps room in the aim for reading a new prompt: one more
        reader is let in only while the readers' decodes, at their typical length, leave it
        (`_readers_keep_pace`); past that, one more sequence would slow every reader below
        reading pace (and, with attention over every cell, lower throughput too), so new work
        waits for a sequence to finish. Otherwise the step grows to `max_step_ms` for throughput."""
        limits = self.limits
        targets = [self.policies[r.lane].itl_target_ms for r in decoding if self.policies[r.lane].interactive]
        pace = self._pace(min(targets)) if targets else 0.0
        aim = self._aim = STEP_AIM * pace if targets else 0.9 * limits.max_step_ms
        base = self._decode_shape()
        # Prefill goes first to interactive lanes: cost it in their cache when they have their own.
        prompt = self._interactive_prompt_can_go(now)
        to = self.split and prompt
        tokens = len(decoding) + self.cost.tokens_within(aim, base, self._cells[to],
                                                         new_decode=not self._num_decoding[to])
        if targets:
            self._min_chunk = 1
            # A prompt that was let in is read by at least a token a step while decoding alone
            # stays under the target (admission left the readers room for it, see `_readers_keep_pace`).
            room = self.cost.predict_ms(base) < pace
            floor = len(decoding) + (1 if room and prompt else 0)
        else:
            self._min_chunk = limits.min_chunk
            floor = len(decoding) + limits.min_chunk
        floor = max(floor, len(decoding) + self._way_back())
        budget = max(min(tokens, limits.max_step_tokens), floor)
        return min(max(int(budget * self._shrink), len(decoding) + 1), limits.max_step_tokens)

    def _fill_split(self, plan: StepPlan, now: float, left: int, reserve: int) -> None:
        """Fill a step when interactive lanes have a cache of their own. Background tokens then
        cost a decode call of their own (and attend over long documents), so background's owed
        share is paid first, in a chunk the step's aim can afford, and only once the debt covers
        that chunk: paying a token or two every step would pay the call every step. Interactive
        prefill takes what the aim leaves; background fills whatever is left after that."""
        used = 0
        if reserve:
            fits = max(self._room(plan, left), min(reserve, self.limits.min_chunk))  # owed, whatever the model says
            if fits and self._bg_credit >= min(fits, self.limits.min_chunk):
                used = self._fill(plan, now, interactive=False, budget=min(reserve, fits))
        budget = left - used
        if used:  # what the interactive lanes may still add within the aim, beside that chunk
            budget = min(budget, self.cost.tokens_within(self._aim, self._shape(plan.items, plan.embed_items),
                                                         self._cells[True], new_decode=not self._uses(plan, True)))
        used += self._fill(plan, now, interactive=True, budget=budget)
        self._fill(plan, now, interactive=False, budget=self._room(plan, left - used))

    def _room(self, plan: StepPlan, left: int) -> int:
        """Background's part of what is left of the step, costed in its own cache: its tokens
        cost more (its cells are long documents, and maybe a decode call of its own) than the
        interactive ones the budget assumed."""
        fits = self.cost.tokens_within(self._aim, self._shape(plan.items, plan.embed_items), self._cells[False],
                                       new_decode=not self._uses(plan, False))
        if self._overdue:
            fits = max(fits, self._share_tokens())
        elif not self._uses(plan, True):  # no interactive token to keep on time: the step's floor
            fits = max(fits, self._min_chunk)
        return min(left, fits)

    def _uses(self, plan: StepPlan, interactive: bool) -> bool:
        """The step already makes a decode call in this class's cache."""
        return any(self.policies[self.requests[i.request_id].lane].interactive == interactive for i in plan.items)

    def _decode_shape(self) -> StepShape:
        """The shape of this step's decodes alone (what `_shape` gives for them, without the items)."""
        classes = (True, False) if self.split else (False,)
        n = {c: self._num_decoding[c] for c in classes}
        total = sum(n.values())
        kcells = sum(n[c] * self._cells[c] for c in classes) / 1000.0
        return StepShape(sum(1 for c in classes if n[c]), total, kcells, total)

    def _shape(self, items: list[ScheduledItem], embed_items: list[ScheduledItem]) -> StepShape:
        """The cost model's view of a step: one decode call per cache used, and each token
        attending over its own cache's cells."""
        tokens = {True: 0, False: 0}
        outputs = 0
        for item in items:
            interactive = self.split and self.policies[self.requests[item.request_id].lane].interactive
            tokens[interactive] += len(item.tokens)
            outputs += item.sample
        embedded = sum(len(i.tokens) for i in embed_items)
        kcells = (tokens[True] * self._cells[True] + tokens[False] * self._cells[False]
                  + embedded * self.embed_kv.num_used_cells) / 1000.0
        decodes = sum(1 for n in (tokens[True], tokens[False], embedded) if n)
        return StepShape(decodes, tokens[True] + tokens[False] + embedded, kcells, outputs)

    def _interactive_prompt_can_go(self, now: float) -> bool:
        """An interactive prompt is part-read, or an eligible one would be admitted now. One that
        would not (its cache full, or the readers at their pace) is no reason to hold background
        back or to size the step for it."""
        if any(self.policies[r.lane].interactive and not r.is_decoding for r in self.running):
            return True
        decoding = sum(1 for r in self.running if r.is_decoding and self.policies[r.lane].interactive)
        for lane, queue in self.waiting.items():
            if not queue or not self.policies[lane].interactive:
                continue
            head = queue[0]
            if not (head.arrival_time <= self._lane_cutoff(lane, now) or head.num_preemptions):
                continue
            if self.split and not self.interactive_kv.can_admit(head.num_tokens, decoding):
                continue  # without a cache of its own, it may take background cells
            if self._readers_keep_pace(head):
                return True
        return False

    def _fill(self, plan: StepPlan, now: float, *, interactive: bool, budget: int) -> int:
        """Give prefill chunks (and embedding inputs) of one class by fair share; tokens used."""
        if budget <= 0:
            return 0
        candidates = self._candidates(now, interactive=interactive)
        planned = {i.request_id for i in plan.items} | {i.request_id for i in plan.embed_items}
        used = 0
        while used < budget and candidates:
            keys = candidates.keys()
            if interactive:
                best = min(self.policies[lane].priority for lane, _ in keys)
                keys = [k for k in keys if self.policies[k[0]].priority == best]
            key = self.fair.pick(keys)
            request = candidates[key].popleft()
            if not candidates[key]:
                del candidates[key]
            if request.request_id in planned:
                continue
            n = self._place(plan, request, budget - used)
            if n == 0:
                candidates.pop(key, None)  # this pair cannot go further this step
                continue
            used += n
        return used

    def _candidates(self, now: float, *, interactive: bool) -> dict[tuple[str, str], deque[Request]]:
        """Each backlogged pair's requests in order: partial prefills, then eligible waiting."""
        out: dict[tuple[str, str], deque[Request]] = {}
        for request in [*self.running, *self.embedding]:
            if self.policies[request.lane].interactive == interactive and not request.is_decoding:
                out.setdefault(request.key, deque()).append(request)
        for lane, queue in self.waiting.items():
            if self.policies[lane].interactive != interactive or not queue:
                continue
            cutoff = self._lane_cutoff(lane, now)
            for request in queue:
                if request.arrival_time > cutoff and not request.num_preemptions:
                    break  # a lane's queue is in arrival order, and so is eligibility
                out.setdefault(request.key, deque()).append(request)
        return out

    def _background_usable(self, now: float, room: int) -> int | None:
        """How many tokens background prefill or embedding work could take this step (so a reserve
        is not wasted); None when none is backlogged and eligible."""
        if any(not self.policies[r.lane].interactive and not r.is_decoding for r in [*self.running, *self.embedding]):
            return room
        usable = None
        for lane, queue in self.waiting.items():
            if self.policies[lane].interactive or not queue:
                continue
            head = queue[0]
            # A request that cannot get its cells now (say, preempted for the chat that holds
            # them) could not use a reserve: keeping one would starve the chat, with nothing run.
            admissible = head.kind is Kind.EMBED or self._fits(head.num_tokens, interactive=False)
            if admissible and (head.arrival_time <= self._lane_cutoff(lane, now) or head.num_preemptions):
                if head.kind is not Kind.EMBED or self._embed_may_go(head.num_tokens, room):
                    return room
                usable = 0
        return usable

    def _embed_may_go(self, n: int, room: int) -> bool:
        """A chunked input goes in what is left of the step. An atomic one larger than that
        overflows the step only when no interactive work is running or background's credit covers it."""
        if self.limits.embed_chunked or n <= room or n <= self._bg_credit or "embeddings" in self._overdue:
            return True
        return not any(self.policies[r.lane].interactive for r in self.running)

    def _lane_cutoff(self, lane: str, now: float) -> float:
        """Requests of this lane that arrived by this time are eligible now (fixed for one step)."""
        cutoff = self._cutoffs.get(lane)
        if cutoff is None:
            cutoff = self._cutoffs[lane] = now - self._eligible_at_for(lane, 0.0)
        return cutoff

    def _place(self, plan: StepPlan, request: Request, room: int) -> int:
        """Schedule part of a request within `room` tokens; the tokens placed (0: cannot)."""
        if request.kind is Kind.EMBED:
            return self._place_embed(plan, request, room)
        n = min(request.num_remaining, room)
        if n <= 0 or (n < request.num_remaining and n < self._min_chunk and plan.items):
            return 0
        if request.status is Status.WAITING and not self._admit(request):
            return 0
        if not self._grow(request, request.num_computed_tokens + n):
            return 0
        plan.items.append(self._item(request, n))
        self._charge_prompt(request, n)
        return n

    def _place_embed(self, plan: StepPlan, request: Request, room: int) -> int:
        if self.limits.embed_chunked:
            n = min(request.num_remaining, room)
            if n <= 0 or (n < request.num_remaining and n < self._min_chunk and plan.embed_items):
                return 0
        else:
            n = request.num_tokens
            if not (n <= room or (not plan.embed_items and self._embed_may_go(n, room))):
                return 0
        if request.status is Status.WAITING:
            if not self.embed_kv.can_admit(request.num_tokens):
                return 0
            self.waiting[request.lane].remove(request)
            request.seq_id = self.embed_kv.admit(request.num_tokens)
            request.status = Status.RUNNING
            request.admitted_time = request.admitted_time or self._now
            self.embedding.append(request)
        start = request.num_computed_tokens
        plan.embed_items.append(ScheduledItem(request.request_id, Kind.EMBED, request.seq_id, start,
                                              request.tokens_slice(start, start + n), start + n == request.num_tokens))
        self._charge_prompt(request, n)
        return min(n, room)

    def _item(self, request: Request, n: int) -> ScheduledItem:
        start = request.num_computed_tokens
        sample = start + n == request.num_tokens
        forced = request.params.forced_tokens
        token = forced[len(request.output_tokens)] if sample and forced is not None else None
        return ScheduledItem(request.request_id, Kind.GENERATE, request.seq_id, start,
                             request.tokens_slice(start, start + n), sample, request.params, token)

    def _charge_prompt(self, request: Request, n: int) -> None:
        end = min(request.num_computed_tokens + n, request.num_prompt_tokens)
        fresh = end - request.num_charged_prompt
        if fresh > 0:
            request.num_charged_prompt = end
            self.fair.charge(request.key, weight=self.policies[request.lane].weight, num_in=fresh)

    # ---- KV admission and preemption ---------------------------------------------------

    def _admit(self, request: Request) -> bool:
        interactive = self.policies[request.lane].interactive
        if request.num_tokens >= self._failed_need[interactive]:
            return False  # a smaller request of this class already could not get in this step
        if interactive and not self._readers_keep_pace(request):
            self._failed_need[interactive] = request.num_tokens
            return False
        while not self._fits(request.num_tokens, interactive):
            if not interactive or self.split or not self._preempt_background():
                self._failed_need[interactive] = request.num_tokens
                return False
        self.waiting[request.lane].remove(request)
        request.seq_id = self._pool_of(interactive).admit(request.num_tokens)
        request.status = Status.RUNNING
        request.admitted_time = request.admitted_time or self._now
        self.running.append(request)
        self._readers_now = None
        return True

    def _readers_keep_pace(self, request: Request) -> bool:
        """Admitting one more interactive sequence keeps the readers' decode step within the aim
        once every interactive sequence, the new one too, has reached its typical length.

        Costing them at their length now would let a burst of young chats in that, as they
        grow, slow every reader past its inter-token target (attention runs each token over
        every cell of its cache) and past the batch size where throughput peaks. A lane whose
        priority beats every running reader's (voice among chats) is always let in."""
        readers = self._readers()
        if not readers.n or self.policies[request.lane].priority < readers.priority:
            return True
        target = self._pace(min(readers.target, self.policies[request.lane].itl_target_ms))
        n, cells = readers.n + 1, readers.cells + self._typical_cells(request)
        if self.split:  # background decodes in their own cache, with a decode call of their own
            shape = StepShape(1, n, n * cells / 1000.0, n)
            if readers.background:
                shape = shape.plus(StepShape(1, readers.background, readers.background * readers.background_cells / 1000.0,
                                             readers.background))
        else:
            n, cells = n + readers.background, cells + readers.background_cells
            shape = StepShape(1, n, n * cells / 1000.0, n)
        return self.cost.predict_ms(shape) <= READERS_AIM * target

    def _pace(self, target_ms: float) -> float:
        """The inter-token time readers are held to: their lane's target or, on a machine too
        slow for it, what lets them share the steps, their decodes taking at most SHARED_PACE
        times a lone reader's step (admission holds them to READERS_AIM of the pace)."""
        lone = self.cost.predict_ms(StepShape(1, 1, 0.0, 1))
        return max(target_ms, SHARED_PACE * lone / READERS_AIM)

    def _readers(self) -> "_Readers":
        """The running interactive sequences as admission costs them (kept until the running set changes)."""
        if self._readers_now is None:
            readers = [r for r in self.running if self.policies[r.lane].interactive]
            background = [r for r in self.running if not self.policies[r.lane].interactive]
            self._readers_now = _Readers(
                len(readers), min((self.policies[r.lane].priority for r in readers), default=0),
                min((self.policies[r.lane].itl_target_ms for r in readers), default=math.inf),
                sum(self._typical_cells(r) for r in readers), sum(1 for r in background if r.is_decoding),
                sum(r.num_computed_tokens if self.split else r.num_tokens for r in background))
        return self._readers_now

    def _typical_cells(self, request: Request) -> int:
        """The cells a generating sequence holds at its lane's typical output length (or its own cap)."""
        typical = min(self._typical_output[request.lane], request.max_tokens)
        return max(request.num_tokens, int(request.num_prompt_tokens + typical))

    def _fits(self, num_cells: int, interactive: bool) -> bool:
        """A free sequence id and cells for it, leaving a cell per decoding sequence for the next step."""
        pool = self._pool_of(interactive)
        num_free = len(pool.free_seq_ids)
        if not num_free or not pool.can_admit(num_cells, self._num_decoding[interactive]):
            return False
        if interactive and not self.split:
            return num_free > self._background_seq_reserve()
        return True

    def _pool_of(self, interactive: bool) -> KVManager:
        return self.interactive_kv if interactive else self.kv

    def _pool(self, request: Request) -> KVManager:
        return self._pool_of(self.policies[request.lane].interactive)

    def _background_share(self) -> tuple[int, int, int, int]:
        """Background sequences and cells held, and the minimum of each it keeps."""
        held = [r for r in self.running if not self.policies[r.lane].interactive]
        share = self.limits.background_min_share
        min_seqs = min(math.ceil(share * self.limits.num_seqs), self.limits.num_seqs - 1)
        cells = sum(self.kv.allocated[r.seq_id] for r in held)
        return len(held), cells, min_seqs, int(share * self.limits.num_cells)

    def _background_seq_reserve(self) -> int:
        """Sequence ids kept free for backlogged background work below its minimum share."""
        if len(self.kv.free_seq_ids) > self.limits.num_seqs * self.limits.background_min_share + 1:
            return 0  # more free than any reserve could ask: skip the scan
        waiting = any(r.kind is Kind.GENERATE for lane, q in self.waiting.items()
                      if not self.policies[lane].interactive for r in q)
        if not waiting:
            return 0
        num_held, _, min_seqs, _ = self._background_share()
        return max(min_seqs - num_held, 0)

    def _grow(self, request: Request, num_cells: int) -> bool:
        """Make room for a request's next tokens, preempting if the cache is full."""
        pool = self._pool(request)
        while not pool.ensure(request.seq_id, num_cells):
            victim = self._victim(pool)
            if victim is None or victim is request:
                self._preempt(request)
                return False
            self._preempt(victim)
        return True

    def _victim(self, pool: KVManager | None = None) -> Request | None:
        """The lowest-priority, latest-admitted running request (holding cells in `pool`, if given)."""
        ranked = [(self.policies[r.lane].priority, i, r) for i, r in enumerate(self.running)
                  if pool is None or self._pool(r) is pool]
        return max(ranked, key=lambda t: t[:2])[2] if ranked else None

    def _preempt_background(self) -> bool:
        """Preempt for an interactive request, unless background is down to its minimum share."""
        victim = self._victim(self.kv)
        if victim is None or self.policies[victim.lane].interactive:
            return False
        num_held, cells, min_seqs, min_cells = self._background_share()
        if num_held <= min_seqs and cells <= min_cells:
            return False
        self._preempt(victim)
        return True

    def _preempt(self, request: Request) -> None:
        """Drop a request's KV and requeue it at the head of its lane, keeping its output."""
        self.running.remove(request)
        self._readers_now = None
        self._pool(request).release(request.seq_id)
        self._release.append(request.seq_id)
        if self._plan is not None:  # preempted while this step is being planned: drop its tokens
            self._plan.items = [i for i in self._plan.items if i.request_id != request.request_id]
        request.seq_id = None
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = Status.WAITING
        self.waiting[request.lane].appendleft(request)

    def _finish(self, request: Request, reason: str, now: float | None) -> None:
        if request.kind is Kind.EMBED and request.seq_id is not None:
            self.embedding.remove(request)
            self.embed_kv.release(request.seq_id)
            self._embed_release.append(request.seq_id)
            request.seq_id = None
        elif request.status is Status.RUNNING and request.seq_id is not None:
            self.running.remove(request)
            self._readers_now = None
            self._pool(request).release(request.seq_id)
            self._release.append(request.seq_id)
            request.seq_id = None
        if request.kind is Kind.GENERATE and reason in ("stop", "length"):
            typical = self._typical_output[request.lane]
            self._typical_output[request.lane] = 0.8 * typical + 0.2 * len(request.output_tokens)
        request.status = Status.FINISHED
        request.finish_reason = reason
        request.finish_time = now if now is not None else self._now
        self._done.append(request.request_id)
        self.requests.pop(request.request_id, None)

    # ---- results -------------------------------------------------------------------

    _now: float = 0.0

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[Output]:
        self._now = now
        if result.no_kv_slot:
            return self._on_no_kv_slot(plan)
        self._shrink = min(self._shrink * 2, 1.0)
        if not plan.empty:
            self.cost.observe(plan.shape, result.elapsed_ms, now)
        outputs = [o for item in plan.items if (o := self._advance(item, result, now))]
        outputs += [o for item in plan.embed_items if (o := self._embedded(item, result, now))]
        return outputs

    def _advance(self, item: ScheduledItem, result: StepResult, now: float) -> Output | None:
        request = self.requests.get(item.request_id)
        if request is None or request.status is not Status.RUNNING or request.seq_id != item.seq_id:
            return None  # aborted or preempted while the step ran
        request.num_computed_tokens = item.start + len(item.tokens)
        if not item.sample:
            return None
        sample = result.samples[item.request_id]
        self._record_token(request, now)
        if sample.is_eog:
            self._finish(request, "stop", now)
            return Output(request, None, True)
        request.output_tokens.append(sample.token)
        request.samples.append(sample)
        self.fair.charge(request.key, weight=self.policies[request.lane].weight, num_out=1)
        if len(request.output_tokens) >= request.max_tokens:
            self._finish(request, "length", now)
            return Output(request, sample, True)
        return Output(request, sample, False)

    def _record_token(self, request: Request, now: float) -> None:
        if request.first_token_time is None:
            request.first_token_time = now
        elif request.last_token_time is not None:
            request.itls.append(now - request.last_token_time)
        request.last_token_time = now

    def _embedded(self, item: ScheduledItem, result: StepResult, now: float) -> Output | None:
        request = self.requests.get(item.request_id)
        if request is None or request.finished or request.seq_id != item.seq_id:
            return None
        request.num_computed_tokens = item.start + len(item.tokens)
        if not item.sample:
            return None
        request.embedding = result.embeddings.get(item.request_id)
        request.first_token_time = now
        self._finish(request, "stop", now)
        return Output(request, None, True)

    def _on_no_kv_slot(self, plan: StepPlan) -> list[Output]:
        """llama.cpp could not place the step: nothing was kept; shrink and free room."""
        self._shrink = max(self._shrink / 2, 1 / 64)  # embedding chunks did not run either: they go again
        victim = self._victim()
        if victim is not None and len(self.running) > 1:
            self._preempt(victim)
        return []

    # ---- helpers -------------------------------------------------------------------

    def _eligible_at(self, request: Request) -> float:
        if request.num_preemptions:
            return request.arrival_time
        return self._eligible_at_for(request.lane, request.arrival_time)

    def _eligible_at_for(self, lane: str, arrival: float) -> float:
        return eligible_at(self.policies[lane], arrival, engine_busy=bool(self.running),
                           num_queued=len(self.waiting[lane]))
