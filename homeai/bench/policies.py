"""The policies a benchmark compares, each a `Policy` (homeai/sched/policy.py) for the one scheduler.

* `homeai`: the scheduler as it ships (lanes, fair share, adaptive chunked prefill).
* `fifo`: continuous batching in arrival order with a fixed step budget, as llama.cpp's
  llama-server and Ollama do: no lanes, no fair share, no latency priority.
* `static`: fixed batches that wait for their longest member before the next batch starts.
* `serial`: one request at a time, as llama-cpp-python's server does.

The baselines see every lane as one class (no interactive priority, no reserve, no preemption
for priority: a full cache preempts the latest admitted), admit at once (no batching windows),
and keep one KV cache for every request (homeai may give interactive lanes a cache of their own).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from homeai.sched.policy import Policy
from homeai.sched.request import Request
from homeai.sched.scheduler import Scheduler, SchedulerLimits
from lanes.base import BACKGROUND, LanePolicy


class Fifo:
    def order(self, partial: list[Request], waiting: dict[str, deque[Request]]) -> list[Request] | None:
        return partial + sorted((r for q in waiting.values() for r in q), key=lambda r: r.arrival_time)

    def admission_open(self, *, num_running: int, num_admitted: int, began_idle: bool) -> bool:
        return True

    def budget(self, max_step_tokens: int) -> int | None:
        return max_step_tokens


class Serial(Fifo):
    def admission_open(self, *, num_running: int, num_admitted: int, began_idle: bool) -> bool:
        return num_running == 0


@dataclass(frozen=True)
class Static(Fifo):
    """Admit a batch only when the previous one has wholly finished."""

    batch_size: int = 8

    def admission_open(self, *, num_running: int, num_admitted: int, began_idle: bool) -> bool:
        return began_idle and num_admitted < self.batch_size


POLICIES = ("serial", "static", "fifo", "homeai")


def make_scheduler(policy: str, lanes: dict[str, LanePolicy], limits: SchedulerLimits,
                   static_batch: int = 8) -> Scheduler:
    if policy == "homeai":
        return Scheduler(lanes, limits)
    rules: dict[str, Policy] = {"fifo": Fifo(), "serial": Serial(), "static": Static(static_batch)}
    if policy not in rules:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    limits = replace(limits, interactive_cells=0)  # the peers keep one cache for every request
    flat = {name: replace(p, lane_class=BACKGROUND, priority=0, window_ms=0.0, max_queue=100_000)
            for name, p in lanes.items()}
    return Scheduler(flat, limits, rules[policy])
