"""Run one workload under one policy: on the real model (wall clock) or simulated (step-cost model).

The driver is the engine's loop without the thread and the streams, so that every policy
is measured the same way: requests join at their arrival times, each step is planned,
run and recorded, and every token's time is kept for the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from homeai.bench.policies import make_scheduler
from homeai.bench.workloads import Spec, Workload, prompt_tokens
from homeai.sched.costmodel import StepCostModel
from homeai.sched.pools import Pool
from homeai.sched.request import Kind, Request, Sample, SamplingParams
from homeai.sched.scheduler import QueueFull, SchedulerLimits, StepPlan, StepResult
from lanes.base import LanePolicy


@dataclass
class RequestRecord:
    spec: Spec
    arrival: float
    admitted: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    reason: str = ""  # stop | length | abort | error | rejected
    preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        first = self.token_times[0] if self.token_times else (self.finish if self.spec.kind == "embed" else None)
        return None if first is None else first - self.arrival

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def ok(self) -> bool:
        return self.reason in ("stop", "length")


@dataclass
class StepRecord:
    start: float
    end: float
    num_tokens: int
    num_decode: int
    num_seqs: int
    kv_used: int
    budget: int
    tokens_by_member: dict[str, int]
    backlogged: list[str]


@dataclass
class RunResult:
    policy: str
    workload: str
    simulated: bool
    records: list[RequestRecord]
    steps: list[StepRecord]
    limits: dict
    cost_model: tuple[float, ...]  # a, b, c, d of homeai.sched.costmodel
    lanes: dict[str, dict]

    @property
    def makespan(self) -> float:
        ends = [r.finish for r in self.records if r.finish is not None]
        return (max(ends) - min(r.arrival for r in self.records)) if ends else 0.0


class SimRunner:
    """A model whose steps take what a step-cost model with these coefficients says; it samples token 1000."""

    def __init__(self, *coefficients: float):
        self.model = StepCostModel(prior=tuple(coefficients))

    def reset(self) -> None:
        pass

    def run(self, plan: StepPlan) -> StepResult:
        samples = {i.request_id: Sample(1000) for i in plan.generating if i.sample}
        embeds = {i.request_id: [0.0] for i in plan.batches[Pool.EMBED]}
        elapsed = 0.0 if plan.empty else self.model.predict_ms(plan.shape)
        return StepResult(samples, embeds, elapsed_ms=elapsed)


def _request(spec: Spec, arrival: float) -> Request:
    kind = Kind.EMBED if spec.kind == "embed" else Kind.GENERATE
    params = SamplingParams(temperature=0, max_tokens=max(spec.output_len, 1), ignore_eos=True)
    return Request(spec.request_id, spec.lane, spec.member, prompt_tokens(spec), arrival, kind=kind, params=params)


def run(workload: Workload, policy: str, lanes: dict[str, LanePolicy], limits: SchedulerLimits, runner,
        *, simulated: bool, progress=None, max_seconds: float = 900.0, plan_ahead: bool = False) -> RunResult:
    """The workload through one scheduler, step by step. `plan_ahead`: as the engine with
    `scheduler.plan_ahead` on, each step's successor is planned when the step starts (while a GPU
    would compute it), before its samples and its time are known (`Scheduler.ahead`, `settle`)."""
    sched = make_scheduler(policy, lanes, limits)
    runner.reset()
    clock = _VirtualClock() if simulated else _WallClock()
    t0 = clock.now()
    pending = sorted(workload.specs, key=lambda s: s.arrival_s)
    if len({s.request_id for s in pending}) != len(pending):
        raise ValueError(f"workload {workload.name} repeats request ids")
    records = {s.request_id: RequestRecord(s, t0 + s.arrival_s) for s in pending}
    live: dict[str, Request] = {}
    steps: list[StepRecord] = []
    ahead: StepPlan | None = None  # the next step, planned ahead
    i = 0
    while True:
        now = clock.now()
        while i < len(pending) and t0 + pending[i].arrival_s <= now:
            spec = pending[i]
            i += 1
            try:
                request = _request(spec, t0 + spec.arrival_s)
                sched.add_request(request)
                live[spec.request_id] = request
            except QueueFull:
                records[spec.request_id].reason = "rejected"
                records[spec.request_id].finish = now
                _tick(progress)
        if not sched.has_work() and i >= len(pending) and ahead is None:
            break
        if now - t0 > max_seconds:
            for request_id in list(live):
                sched.abort(request_id, "abort", now)
            break
        if ahead is not None:  # planned while the step before ran
            plan, ahead = ahead, None
            sched.prune(plan)
            if any(sched.waiting.values()):  # came since it was planned
                plan = sched.replan(plan, now)
            if plan.empty:
                runner.run(plan)  # its cache operations
                continue
        else:
            plan = sched.schedule(now)
        if plan.empty:
            wake = [t0 + pending[i].arrival_s] if i < len(pending) else []
            nxt = sched.next_wakeup(now)
            if nxt is not None and nxt > now:
                wake.append(nxt)
            if not plan.idle:
                runner.run(plan)
            clock.sleep_until(min(wake) if wake else now + 0.001)
            continue
        backlogged = sorted({r.member for r in sched.requests.values()})
        by_member: dict[str, int] = {}
        for item in plan.items:
            member = live[item.request_id].member
            by_member[member] = by_member.get(member, 0) + len(item.tokens)
        result = runner.run(plan)
        if plan_ahead:
            settling = sched.ahead(plan, now)
            ahead = sched.schedule(now) if sched.only_decoding() else None
            end = clock.advance(result.elapsed_ms / 1000.0)
            outputs = sched.settle(plan, settling, result, end, ahead)
            ahead = None if ahead is None or ahead.idle else ahead
        else:
            end = clock.advance(result.elapsed_ms / 1000.0)
            outputs = sched.update(plan, result, end)
        steps.append(StepRecord(now, end, plan.num_tokens, sum(1 for x in plan.generating if len(x.tokens) == 1 and x.sample),
                                len(plan.items), _cells_used(sched), plan.budget,
                                by_member, backlogged))
        for out in outputs:
            rec = records[out.request.request_id]
            if out.sample is not None:
                rec.token_times.append(end)
            if out.finished:
                _finish(rec, out.request, end, live, progress)
    for request_id, request in list(live.items()):  # aborted at the time limit
        _finish(records[request_id], request, clock.now(), live, progress)
    return RunResult(policy, workload.name, simulated, list(records.values()), steps,
                     sched.limits.__dict__.copy(), sched.cost.coefficients, {k: v.__dict__.copy() for k, v in lanes.items()})


def _cells_used(sched) -> int:
    """KV cells in use over both caches (the interactive lanes may have their own)."""
    return sum(sched.pools.cells_used(pool) for pool in sched.pools.generating)


def _finish(rec: RequestRecord, request: Request, now: float, live: dict, progress) -> None:
    rec.finish = request.finish_time or now
    rec.admitted = request.admitted_time
    rec.reason = request.finish_reason or "abort"
    rec.preemptions = request.num_preemptions
    live.pop(request.request_id, None)
    _tick(progress)


def _tick(progress) -> None:
    if progress is not None:
        progress.update(1)


class _WallClock:
    def now(self) -> float:
        return time.perf_counter()

    def advance(self, _elapsed: float) -> float:
        return time.perf_counter()

    def sleep_until(self, t: float) -> None:
        delay = t - time.perf_counter()
        if delay > 0:
            time.sleep(min(delay, 0.05))


class _VirtualClock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, elapsed: float) -> float:
        self.t += elapsed
        return self.t

    def sleep_until(self, t: float) -> None:
        self.t = max(self.t, t)
