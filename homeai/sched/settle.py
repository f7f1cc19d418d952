"""The settlement of a step: what ran, settled from the plan that ran (as vLLM v1's
`update_from_output`). `schedule()` only plans; the tokens computed, fair share's charges and
background's credit are settled here, once the step ran (`update()`). A step that found no KV
slot settles none of it (it shrinks the next and frees room), nor does one that raised (`fail()`:
its requests end with an error).

A step may also be settled in two halves, so that the next one is planned while it computes
(the engine's plan-ahead, for a GPU that returns from `llama_decode` before the logits are read):
`ahead()` settles what does not depend on the samples and holds each sampled token's place with
PENDING; `settle()` writes the tokens there (and into the next plan's items), ends a request
that sampled an end of generation, and teaches the cost model the step's time. The next step
is then planned one step late on those ends and that time; `prune()` drops from it whatever
ended before it runs. `update()` and `ahead()` are one pass (`_settle`), with the samples or
without them.

`Settlement` is a part of `Scheduler` (`scheduler.py`), which holds the state it settles.
"""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple

from homeai.sched.plan import Output, ScheduledItem, StepPlan, StepResult, new_tuple
from homeai.sched.pools import Pool
from homeai.sched.request import GENERATE_KIND, RUNNING, WAITING, Request, Status

_REQUEST_ID = attrgetter("request_id")
FINISHED = Status.FINISHED  # (a plain name: see `request.RUNNING`)
PENDING = -1  # a sampled token's place while the step that samples it computes (`ahead`)


class Pending(NamedTuple):
    """A sampled row of a step settled ahead: its request, the position its token takes, and whether
    `ahead` ended the request already (the row is its last token: "length", or an embedding input's)."""

    request: Request
    position: int
    ended: bool


class Settlement:
    """The scheduler's settling half (a part of `Scheduler`)."""

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
        if not plan.empty:  # the step's time taught (before `_settle`: the prompt cache's expiry reads the cost model)
            self.cost.observe(plan.shape, result.elapsed_ms, now)
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
        self._clock = now
        if not plan.empty:
            self.cost.observe(plan.shape, result.elapsed_ms, now)
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
            last = request.last_token_time  # (the row's timing, written out as in `_settle`)
            if request.first_token_time is None:
                request.first_token_time = now
            elif last is not None:
                request.itls.append(now - last)
            request.last_token_time = now
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
        drafts = plan.drafts
        for item in plan.generating:
            request_id, _, seq_id, start, tokens, sampled, _, _ = item
            request = requests.get(request_id)
            if request is None or request.status is not RUNNING or request.seq_id != seq_id:
                continue  # aborted or preempted while the step ran (or was planned)
            if drafts and request_id in drafts:  # (a step with drafts is never settled ahead: the engine's loop)
                self._settle_drafted(request, start, drafts[request_id], result, now, settled)
                continue
            if request.num_charged_prompt < len(request.prompt_tokens):  # else nothing to charge (a decode's case)
                self._charge_prompt(request, item)
            request.num_computed_tokens = start + len(tokens)
            if not sampled:
                continue
            if samples is None:
                token = PENDING
            else:
                sample = samples[request_id]
                # The row's timing, written out here and in `settle` (every sequence, every step): as a method
                # of `Request` its call cost ~440 instructions a sequence, 0.6% of schedule() and update()
                # at four sequences (`sched_step_cost.py --callgrind`).
                last = request.last_token_time
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

    def _settle_drafted(self, request: Request, start: int, guess: list[int], result: StepResult, now: float,
                        settled: list) -> None:
        """A decode that carried drafted tokens (`draft.py`): the guesses its sampling picked and the
        token after them are its output, all timed now; its cells are those of its last token and the
        accepted guesses (the runner cut the rest). Fair share is charged every row that ran, accepted
        or not (an end of generation's row aside, as a decode's is); the pair's acceptance is learnt."""
        accepted = result.accepted.get(request.request_id, ())
        self.drafting.learn(request.key, request.request_id, len(guess), len(accepted))
        request.num_computed_tokens = start + 1 + len(accepted)
        final = result.samples[request.request_id]
        self._charge_output(request, len(guess) + (0 if final.is_eog else 1))
        output, params = request.output_tokens, request.params
        last = request.last_token_time
        if request.first_token_time is None:
            request.first_token_time = now
        elif last is not None:
            request.itls.append(now - last)
        request.itls += [0.0] * len(accepted)  # (they reach the client with the step's last token)
        request.last_token_time = now
        for sample in (*accepted, final):
            if sample.is_eog:
                self._finish(request, "stop", now)
                settled.append(Output(request, None, True))
                return
            output.append(sample.token)
            if params.record_logits:
                request.samples.append(sample)
            ended = len(output) >= request.max_tokens
            if ended:
                self._finish(request, "length", now)
            settled.append(Output(request, sample, ended))
            if ended:
                return

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


def _embedded(request: Request, result: StepResult, now: float) -> Output:
    """An embedding input's last chunk ran (its request ended "stop"): its vector, out."""
    request.embedding = result.embeddings.get(request.request_id)
    request.first_token_time = request.finish_time = now
    return Output(request, None, True)
