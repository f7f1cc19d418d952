"""Placement: which prefill chunks and embedding inputs take what is left of a step's budget.

Candidates are each backlogged (lane, member) pair's requests in order (partial prefills,
then eligible waiting), one class at a time; the best-priority lanes of a class go first and
fair share picks the pair (on a tie, the interactive pair holding fewer sequences). A chunk
smaller than the step's `min_chunk` is not worth placing unless it finishes its prompt. A policy
may instead give one strict order that nothing overtakes.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from homeai.sched.admission import Admission
from homeai.sched.costmodel import StepShape
from homeai.sched.fairshare import FairShare
from homeai.sched.plan import ScheduledItem, StepPlan, new_tuple
from homeai.sched.pools import GENERATE, KVPools, Pool
from homeai.sched.queues import WaitingQueues
from homeai.sched.request import GENERATE_KIND, WAITING, Kind, Request, Status
from homeai.sched.share import BackgroundShare
from homeai.sched.step import Step
from lanes.base import LanePolicy

# Make room for a request's next tokens in the plan being built (may preempt; False: it could not).
Grow = Callable[[Request, int, StepPlan], bool]
# Preempt a request, taking its tokens out of the plan being built.
Preempt = Callable[[Request, StepPlan], None]


class Placement:
    def __init__(self, policies: dict[str, LanePolicy], queues: WaitingQueues, pools: KVPools,
                 fair: FairShare, admission: Admission, share: BackgroundShare, grow: Grow, preempt: Preempt,
                 embed_chunked: bool, first_step: float):
        self.policies, self.queues, self.waiting, self.pools, self.fair = policies, queues, queues.lanes, pools, fair
        self.admission, self.share, self.grow, self.preempt = admission, share, grow, preempt
        self.embed_chunked, self.first_step = embed_chunked, first_step
        self.priority = {lane: policy.priority for lane, policy in policies.items()}  # per lane (`_rank`)

    def gives_first_token(self, step: Step, plan: StepPlan) -> bool:
        """The plan samples an interactive request's first token. (One with no output is still
        reading its prompt: only those are looked for among the plan's items.)"""
        waiting_first = {r.request_id for r in step.running(self.pools)[1] if r.interactive and not r.output_tokens}
        return bool(waiting_first) and any(i.sample and i.request_id in waiting_first
                                           for pool in GENERATE for i in plan.batches[pool])

    def first_token_room(self, step: Step, plan: StepPlan, left: int) -> int:
        """Background's room in a step that gives an interactive request its first token: a person
        waits on that step (a spoken question, a chat's first word), so background rides only up
        to `first_step` times what the step costs so far, whatever was owed or overdue; paid back
        in the steps after (`step.first_token_waits` is never true two steps running)."""
        if not step.first_token_waits or not self.gives_first_token(step, plan):
            return left
        shape = self.shape(step, plan)
        room = step.cost.tokens_within(self.first_step * step.cost.predict_ms(shape), shape, step.cells[Pool.MAIN],
                                       new_decode=not plan.batches[Pool.MAIN])
        return min(left, room)

    def shape(self, step: Step, plan: StepPlan) -> StepShape:
        """The cost model's view of the plan so far (the embedding context's cells as they are now)."""
        return plan.cost_shape({**step.cells, Pool.EMBED: self.pools.cells_used(Pool.EMBED)})

    def fill(self, step: Step, plan: StepPlan, *, interactive: bool, budget: int) -> int:
        """Give prefill chunks (and embedding inputs) of one class by fair share; tokens used."""
        if budget <= 0:
            return 0
        candidates = self._candidates(step, interactive)
        planned = plan.request_ids()
        used = 0
        ranked, at, version = [], 0, None  # the pairs in fair share's order, while it stands
        while used < budget and candidates:
            if version != self.pools.version:  # a chunk was placed, or the running set changed
                ranked, at, version = self._rank(step, candidates, interactive), 0, self.pools.version
            while ranked[at] not in candidates:  # gone for this step: the next pair in the order
                at += 1
            key = ranked[at]
            request = candidates[key].popleft()
            if request.status is WAITING and request.kind is GENERATE_KIND and self.admission.refused(request, step):
                del candidates[key]  # as `place` would end, without its checks (most pairs of a full house)
                continue
            if not _goes_on(candidates[key], step):
                del candidates[key]
            if request.request_id in planned:
                continue
            n = self.place(step, plan, request, budget - used)
            if n == 0:
                candidates.pop(key, None)  # this pair cannot go further this step
                continue
            used += n
            version = None  # its pair's planned cost grew
        return used

    def _rank(self, step: Step, candidates: dict[tuple[str, str], deque[Request]],
              interactive: bool) -> list[tuple[str, str]]:
        """The pairs with candidates in the order they go: the interactive lanes of best priority
        first, and within them (and in the background class) by fair share, on a tie the member
        holding fewer readers first. Ranked once and walked while nothing it reads changes (a
        refused request changes nothing), so trying each pair costs a step no pass over the others."""
        if not interactive:
            return self.fair.rank(candidates, None, step.planned)
        return self.fair.rank(candidates, self.admission.members.holdings(), step.planned, first=self.priority)

    def fill_in_order(self, step: Step, plan: StepPlan, order: list[Request], budget: int) -> int:
        """Place candidates in a policy's strict order: nothing overtakes a request that cannot go
        (an embedding input that cannot is skipped: it waits for its own context's room)."""
        used = 0
        for request in order:
            if used >= budget:
                break
            n = self.place(step, plan, request, budget - used)
            if n == 0 and request.kind is not Kind.EMBED:
                break
            used += n
        return used

    def _candidates(self, step: Step, interactive: bool) -> dict[tuple[str, str], deque[Request]]:
        """Each backlogged pair's requests in order: partial prefills, then eligible waiting (a
        lane's, up to its first that is not: its queue is in arrival order, and so is eligibility).
        A lane in arrival order gives each pair whose first request is eligible its whole queue,
        copied at once; the fill stops at the pair's first ineligible one (`_goes_on`), which is
        the same: a waiting request is looked at when its turn comes, not each one every step."""
        out: dict[tuple[str, str], deque[Request]] = {}
        for request in step.reading(self.pools):
            if request.interactive == interactive:
                out.setdefault(request.key, deque()).append(request)
        for lane, queue in self.waiting.items():
            if self.policies[lane].interactive != interactive or not queue:
                continue
            if self.queues.in_arrival_order(lane):
                for member, pair in self.queues.pairs[lane].items():
                    if step.eligible(pair[0]):
                        out.setdefault((lane, member), deque()).extend(pair)
                continue
            for request in queue:
                if not step.eligible(request):
                    break
                out.setdefault(request.key, deque()).append(request)
        return out

    def place(self, step: Step, plan: StepPlan, request: Request, room: int) -> int:
        """Schedule part of a request within `room` tokens; the tokens placed (0: cannot)."""
        if request.kind is not GENERATE_KIND:
            return self._place_embedding(step, plan, request, room)
        remaining = request.num_remaining
        n = min(remaining, room)
        if n <= 0 or (n < remaining and n < step.min_chunk and any(plan.batches[p] for p in GENERATE)):
            return 0
        if request.status is WAITING and not self.admission.admit(request, step,
                                                                          lambda victim: self.preempt(victim, plan)):
            return 0
        n = min(n, request.num_remaining)  # admission may have found part of it cached
        if request.whole_images:  # an image read whole is not cut (a step may then carry more than its room)
            n = request.chunk_end(request.num_computed_tokens, n)
        if not self.grow(request, request.num_computed_tokens + n, plan):
            return 0
        plan.batches[request.pool].append(item(request, n))
        self._plan_charge(step, request, n)
        return n

    def _place_embedding(self, step: Step, plan: StepPlan, request: Request, room: int) -> int:
        batch = plan.batches[Pool.EMBED]
        if self.embed_chunked:
            n = min(request.num_remaining, room)
            if n <= 0 or (n < request.num_remaining and n < step.min_chunk and batch):
                return 0
        else:
            n = request.num_tokens
            if not (n <= room or (not batch and self.admission.embedding_may_go(request, room, step))):
                return 0
        if request.status is Status.WAITING and not self.admission.admit_embedding(request, step):
            return 0
        start = request.num_computed_tokens
        batch.append(ScheduledItem(request.request_id, Kind.EMBED, request.seq_id, start,
                                   request.tokens_slice(start, start + n), start + n == request.num_tokens))
        self._plan_charge(step, request, n)
        return min(n, room)

    def _plan_charge(self, step: Step, request: Request, n: int) -> None:
        """What the next `n` tokens would cost the request's pair (prompt tokens not yet charged:
        a recompute is free), for fair share's pick in the rest of the step."""
        fresh = min(request.num_computed_tokens + n, request.num_prompt_tokens) - request.num_charged_prompt
        if fresh > 0:
            cost = self.fair.cost(weight=self.policies[request.lane].weight, num_in=fresh)
            step.planned[request.key] = step.planned.get(request.key, 0.0) + cost


def _goes_on(candidates: deque[Request], step: Step) -> bool:
    """A pair has a candidate left: its next is in flight or an eligible waiting request."""
    return bool(candidates) and (candidates[0].status is not WAITING or step.eligible(candidates[0]))


def item(request: Request, n: int) -> ScheduledItem:
    """The next `n` tokens of a generating request (made for every sequence every step)."""
    start = request.num_computed_tokens
    sample = start + n == len(request.prompt_tokens) + len(request.output_tokens)
    forced = request.params.forced_tokens
    token = forced[len(request.output_tokens)] if sample and forced is not None else None
    return ScheduledItem(request.request_id, Kind.GENERATE, request.seq_id, start,
                         request.tokens_slice(start, start + n), sample, request.params, token)


def decode_item(request: Request) -> ScheduledItem:
    """`item(request, 1)` of a sequence decoding (one a sequence a step): its last output token,
    sampled after."""
    output, params = request.output_tokens, request.params
    forced = params.forced_tokens
    return new_tuple(ScheduledItem, (request.request_id, GENERATE_KIND, request.seq_id, request.num_computed_tokens,
                                     output[-1:], True, params, forced[len(output)] if forced is not None else None))
