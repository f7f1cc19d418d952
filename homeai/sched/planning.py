"""The plan of a step (`schedule()`): which tokens of which sequences run now. It only plans:
what ran is settled from the plan that ran (`settle.py`).

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

Every rule of a step reads one `Step`, built once when the step begins (`step.py`); a hold on
background (a voice turn's pause) is an input to `schedule()`. A `Policy` may change the candidates' order,
admission and the budget (the benchmark's baselines do). A plan made while the step before
computes (the engine's plan-ahead) holds decodes alone (`only_decoding`), is made again whole when
requests came meanwhile (`replan`), and loses whatever ended before it runs (`prune`).

`Planning` is a part of `Scheduler` (`scheduler.py`), which holds the state it reads.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Callable

from homeai.sched.costmodel import StepShape
from homeai.sched.draft import HISTORY_TURNS
from homeai.sched.placement import decode_item
from homeai.sched.plan import StepPlan
from homeai.sched.pools import GENERATE, Pool
from homeai.sched.request import RUNNING, Request
from homeai.sched.settle import PENDING
from homeai.sched.step import Admissions, Moment, Step
from homeai.sched.window import eligible_at

_NUM_COMPUTED = attrgetter("num_computed_tokens")


class Planning:
    """The scheduler's planning half (a part of `Scheduler`)."""

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
        if self.drafting.settings.enabled and not step.prompt:  # (no interactive prompt needs the room)
            self._draft(step, plan, decoding)
        usable = self._fill(step, plan)
        if usable is not None or step.deferred > 0:  # background is backlogged: owed its share, once the step ran
            interactive = {r.request_id for r in self.running if r.interactive}
            plan.background = self.share.due(plan, interactive, call_tokens=self.cost.call_tokens(),
                                             own_calls=self.layout.own_calls)
        else:
            self.share.forget()
        # Nothing placed beside the decodes and none of them dropped (a preemption changes the running
        # set): the plan is costed as its decodes were (most steps; a pass over the items else).
        alone = (self.pools.version == version and not plan.batches[Pool.EMBED] and not plan.num_drafted
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
        left = plan.budget - len(plan.generating) - plan.num_drafted
        order = self.policy.order(partial, self.waiting)
        if order is not None:
            self.placement.fill_in_order(step, plan, order, left)
            return None
        usable = self.admission.background_usable(step, left)
        if partial or not self.admission.all_refused():  # (else every candidate would be refused: nothing to place)
            self.layout.fill(self.placement, step, plan, left, self.share.reserve(usable, left, step.min_chunk))
        return usable

    def _draft(self, step: Step, plan: StepPlan, decoding: list[Request]) -> None:
        """Drafted tokens after the decodes of the drafting lanes' answers (interactive first, as
        `decoding` is ordered), each as many as pay for themselves (`Drafting.length`), within the
        step's budget, the answer's last token and the cells free in its cache (nothing is evicted or
        preempted for a guess)."""
        drafting = self.drafting
        room = plan.budget - len(decoding)
        shape = step.decodes
        limit_ms = max(step.aim, step.cost.predict_ms(shape))  # the readers' step time is not made longer for a guess
        background = self._background_fills(step)  # its weight, when its chunks would take what a guess takes
        for r in decoding:
            if room <= 0:
                return
            output = r.output_tokens
            if (r.status is not RUNNING or not drafting.drafts(r.lane) or r.params.forced_tokens is not None
                    or output[-1] == PENDING):  # (a plan made ahead: the token before is not known yet)
                continue
            guess = drafting.guess(r.request_id, r.prompt_tokens, output, lambda: self.pools.history(r, HISTORY_TURNS))
            if not guess and (not drafting.settings.model or r.images):  # (a draft model reads no images)
                continue
            cells = step.cells[r.pool]
            k = drafting.length(r.key, r.request_id, step.cost, shape, cells,
                                min(room, r.max_tokens - len(output) - 1, len(guess) or drafting.settings.max_draft),
                                limit_ms, background / self.policies[r.lane].weight)
            if not k or not self.pools.kv[r.pool].ensure(r.seq_id, r.num_computed_tokens + 1 + k):
                continue
            if guess:
                guess = guess[:k]
                batch = plan.batches[r.pool]
                at = next(i for i, item in enumerate(batch) if item.request_id == r.request_id)
                batch[at] = batch[at]._replace(tokens=output[-1:] + guess)
                plan.drafts[r.request_id] = guess
            else:  # the draft model's guess, made by the runner (its item's tokens a list of their own: `decode_item`)
                plan.model_drafts[r.request_id] = (r.prompt_tokens, output, k)
            plan.num_drafted += k
            room -= k
            shape = shape.plus(StepShape(0, k, k * cells / 1000.0, 0))  # (as `cost_shape` counts them)

    def _background_fills(self, step: Step) -> float:
        """The highest fair-share weight of the background lanes with a prompt to read (waiting, or
        part-read), whose chunks would fill what a step leaves; 0.0: none has one."""
        weights = [self.policies[lane].weight for lane, queue in self.waiting.items()
                   if queue and not self.policies[lane].interactive]
        weights += [self.policies[r.lane].weight for r in step.reading(self.pools) if not r.interactive]
        return max(weights, default=0.0)

    def _finishes_alone(self, cells: dict[Pool, int]) -> bool:
        """Nothing decodes and a member's question is to be read: a longer step (`lone_step`) only where
        one reads it whole (its first token then comes sooner). A question longer than that is read in
        plain steps to its end, since another member asking meanwhile waits for the step in flight (a
        camera's picture questions held a chat's TTFT p95 at 6.2x idle in lone steps, 2.1x in plain ones)."""
        if any(r.interactive and not r.output_tokens and r.num_computed_tokens for r in self.running):
            return False  # a question too long for one such step is read in plain steps to its end
        left = self._first_question()
        if left is None:
            return False
        within = self.cost.tokens_within(self.pacing.aim(None, lone=True), StepShape(0), cells[self.pools.of_class(True)],
                                         new_decode=True)
        return left <= within

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
        decodes = plan.decodes_shape(num_decoding, cells)  # the plan holds its decodes alone so far
        lone = not decoding_now and (not prompt or self._finishes_alone(cells))
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

    # ---- a plan made while the step before computes (the engine's plan-ahead) -------------

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

    def _eligible_at(self, lane: str, arrival: float) -> float:
        return eligible_at(self.policies[lane], arrival, engine_busy=bool(self.running),
                           num_queued=len(self.waiting[lane]))
