"""Scheduler test helpers: a scripted fake runner and request factories (no model)."""

from __future__ import annotations

import itertools

from homeai.sched.costmodel import StepShape
from homeai.sched.pools import Copy, Pool
from homeai.sched.request import Kind, Request, Sample, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits, StepPlan, StepResult
from lanes import DEFAULT_POLICIES

_ids = itertools.count()


def create_scheduler(policies=None, **overrides) -> Scheduler:
    limits = dict(num_cells=4096, num_seqs=16, max_step_tokens=256, embed_max_tokens=512,
                  embed_max_seqs=16, min_chunk=8)
    limits.update(overrides)
    return Scheduler(policies or dict(DEFAULT_POLICIES), SchedulerLimits(**limits))


def create_request(lane="chat", member="alice", num_prompt=16, max_tokens=8, arrival=0.0,
                   kind=Kind.GENERATE) -> Request:
    rid = f"r{next(_ids)}"
    prompt = [(hash(rid) + i) % 1000 + 10 for i in range(num_prompt)]
    return Request(rid, lane, member, prompt, arrival, kind=kind, params=SamplingParams(max_tokens=max_tokens))


def token_for(request_id: str, position: int) -> int:
    """The fake model's output: a pure function of the request and position."""
    return (sum(map(ord, request_id)) * 31 + position * 7) % 997 + 3


class FakeRunner:
    """Computes nothing; samples a deterministic token; checks the plan's own invariants."""

    def __init__(self, step_ms: float = 10.0, cost=None):
        self.step_ms = step_ms
        self.cost = cost  # a StepShape's milliseconds, if steps are not all step_ms long
        self.positions: dict[tuple[Pool, int], int] = {}  # (pool, seq id) -> next position expected (KV held)
        self.plans: list[StepPlan] = []
        self.pooled: dict[str, int] = {}  # tokens embedded so far per input

    def run(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        for pool, ops in plan.cache_ops.items():
            for op in ops:
                if isinstance(op, Copy):
                    held = self.positions.get((pool, op.src), 0)
                    assert held >= op.length, f"{pool}: copying {op.length} cells of seq {op.src}, which holds {held}"
                    assert (pool, op.dst) not in self.positions, f"{pool}: copying into seq {op.dst}, which holds cells"
                    self.positions[pool, op.dst] = op.length
                elif op.start == 0:
                    self.positions.pop((pool, op.seq_id), None)
                elif (pool, op.seq_id) in self.positions:
                    self.positions[pool, op.seq_id] = min(self.positions[pool, op.seq_id], op.start)
        result = StepResult(elapsed_ms=self.cost(plan.shape) if self.cost else self.step_ms)
        for pool, items in plan.batches.items():
            seqs = [i.seq_id for i in items]
            assert len(seqs) == len(set(seqs)), f"a sequence appears twice in one step of {pool}"
            for item in items:
                expected = self.positions.get((pool, item.seq_id), 0)
                assert item.start == expected, f"{item.request_id}: position {item.start}, {pool} holds {expected}"
                self.positions[pool, item.seq_id] = item.start + len(item.tokens)
                if pool is Pool.EMBED:  # the "embedding" is the number of tokens pooled
                    self.pooled[item.request_id] = self.pooled.get(item.request_id, 0) + len(item.tokens)
                    if item.sample:
                        result.embeddings[item.request_id] = [float(self.pooled.pop(item.request_id))]
                elif item.sample:
                    result.samples[item.request_id] = Sample(token_for(item.request_id, item.start + len(item.tokens)))
        return result

    def holds(self, pool: Pool) -> bool:
        """The fake model holds KV in this pool's cache."""
        return any(p is pool for p, _ in self.positions)


def cpu_ms(shape) -> float:
    """A CPU's step: 20 ms a decode call, 3 ms a token, 1 ms a token per thousand cells."""
    return 20 * shape.decodes + 3 * shape.tokens + shape.token_kcells + 0.5 * shape.outputs


def taught(sched: Scheduler, cost) -> Scheduler:
    """The scheduler's cost model, taught a step cost function."""
    for _ in range(50):
        for shape in (StepShape(1, 100, 0.0, 1), StepShape(1, 10, 30.0, 5), StepShape(2, 40, 60.0, 2), StepShape(1, 8, 2.0, 8)):
            sched.cost.observe(shape, cost(shape))
    return sched


def step(sched: Scheduler, runner: FakeRunner, now: float):
    plan = sched.schedule(now)
    result = runner.run(plan)
    return plan, sched.update(plan, result, now + runner.step_ms / 1000)


def run_until_idle(sched: Scheduler, runner: FakeRunner, now: float = 0.0, max_steps: int = 10_000) -> float:
    for _ in range(max_steps):
        if not sched.has_work():
            return now
        wake = sched.next_wakeup(now)
        plan, _ = step(sched, runner, now)
        now += runner.step_ms / 1000
        if plan.empty and wake is not None:
            now = max(now, wake)
    raise AssertionError("scheduler did not drain")
