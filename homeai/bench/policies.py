"""The policies a benchmark compares, as variations of the one scheduler.

* `homeai`: the scheduler as it ships (lanes, fair share, adaptive chunked prefill).
* `fifo`: continuous batching in arrival order with a fixed step budget, as llama.cpp's
  llama-server and Ollama do: no lanes, no fair share, no latency priority.
* `static`: fixed batches that wait for their longest member before the next batch starts.
* `serial`: one request at a time, as llama-cpp-python's server does.

The baselines admit at once (no batching windows), never preempt for priority, and keep
one KV cache for every request (homeai may give interactive lanes a cache of their own).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from homeai.sched.request import Request
from homeai.sched.scheduler import Scheduler, SchedulerLimits, StepPlan
from lanes.base import LanePolicy


class FifoScheduler(Scheduler):
    def _budget(self, decoding: list[Request], now: float) -> int:
        return self.limits.max_step_tokens

    def _fill(self, plan: StepPlan, now: float, *, interactive: bool, budget: int) -> int:
        if interactive:
            return 0  # one class: everything is filled below, in arrival order
        used = 0
        for request in self._in_order():
            if used >= budget:
                break
            n = self._place(plan, request, budget - used)
            if n == 0 and not request.kind.value == "embed":
                break  # strict arrival order: nothing overtakes a request that cannot go
            used += n
        return used

    def _in_order(self) -> list[Request]:
        partial = [r for r in [*self.running, *self.embedding] if not r.is_decoding]
        waiting = sorted((r for q in self.waiting.values() for r in q), key=lambda r: r.arrival_time)
        return partial + waiting

    def _admit(self, request: Request) -> bool:
        if not self._admission_open():
            return False
        if not self._fits(request.num_tokens, False):
            return False
        queue: deque = self.waiting[request.lane]
        queue.remove(request)
        request.seq_id = self.kv.admit(request.num_tokens)
        request.status = request.status.__class__.RUNNING
        request.admitted_time = request.admitted_time or self._now
        self.running.append(request)
        self._admitted()
        return True

    def _admission_open(self) -> bool:
        return True

    def _admitted(self) -> None:
        pass

    def _victim(self, pool=None) -> Request | None:
        return self.running[-1] if self.running else None

    def _background_usable(self, now: float, room: int) -> int | None:
        return None  # no reserve: one class


class SerialScheduler(FifoScheduler):
    def _admission_open(self) -> bool:
        return not self.running


class StaticScheduler(FifoScheduler):
    """Admit a batch only when the previous one has wholly finished."""

    def __init__(self, policies, limits, batch_size: int = 8):
        super().__init__(policies, limits)
        self.batch_size = batch_size
        self._open = True
        self._admitted_this_batch = 0

    def schedule(self, now: float) -> StepPlan:
        if not self.running:
            self._open, self._admitted_this_batch = True, 0
        plan = super().schedule(now)
        if self.running:
            self._open = False
        return plan

    def _admission_open(self) -> bool:
        return self._open and self._admitted_this_batch < self.batch_size

    def _admitted(self) -> None:
        self._admitted_this_batch += 1


POLICIES = ("serial", "static", "fifo", "homeai")


def make_scheduler(policy: str, lanes: dict[str, LanePolicy], limits: SchedulerLimits,
                   static_batch: int = 8) -> Scheduler:
    if policy == "homeai":
        return Scheduler(lanes, limits)
    limits = replace(limits, interactive_cells=0)  # the peers keep one cache for every request
    flat = {name: replace(p, window_ms=0.0, max_queue=100_000) for name, p in lanes.items()}
    if policy == "fifo":
        return FifoScheduler(flat, limits)
    if policy == "serial":
        return SerialScheduler(flat, limits)
    if policy == "static":
        return StaticScheduler(flat, limits, static_batch)
    raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
