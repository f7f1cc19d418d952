"""One step's facts: what every rule of the step reads, fixed when the step begins.

`Scheduler.schedule()` first knows the `Moment` (the clock, the cost model, who is eligible):
the rules that shape the step read only that (a member's reader slot, whether an interactive
prompt can go). It then builds the one `Step` of the schedule, the moment and the step's
shape together, and passes it down; no rule keeps per-step state of its own. What admission
learns while the step is planned (a smaller request already refused, the running set as
costed) and the fair-share cost of the chunks placed so far (`planned`) are its mutable parts;
nothing else of a moment or a step is changed once it is made (they are not frozen dataclasses
only because making those cost ~8 us more a step, a tenth of a step of one sequence decoding).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from homeai.sched.costmodel import StepCostModel, StepShape
from homeai.sched.pacing import Readers
from homeai.sched.pools import KVPools, Pool
from homeai.sched.request import RUNNING, Request


@dataclass(slots=True)
class Admissions:
    """What admission learns while one step is planned."""

    # Per class and caches (`Request.pools`), the fewest tokens a request was refused with (larger
    # ones are not tried again).
    failed_need: dict[tuple[bool, tuple[Pool, ...]], float] = field(default_factory=dict)
    readers: tuple[int, Readers] | None = None  # the running set as costed, and the pools' version then
    decoding: tuple[int, Counter[Pool]] | None = None  # sequences decoding per pool, and the pools' version then
    num_admitted: int = 0
    split: tuple[int, list[Request], list[Request]] | None = None  # `Moment.running`'s, and the pools' version then


@dataclass(slots=True)
class Moment:
    """What is known when a step begins, before it is shaped."""

    now: float
    cost: StepCostModel  # the step-cost model, as it stands
    cutoffs: dict[str, float]  # per lane with requests waiting, those that arrived by this time are eligible
    admissions: Admissions

    def running(self, pools: KVPools) -> tuple[list[Request], list[Request]]:
        """The generating sequences decoding and those still reading their input, in admission
        order. Asked by several rules of a step; split again only when the running set changed:
        while a step is planned nothing else moves a sequence from one to the other."""
        memo = self.admissions
        if memo.split is None or memo.split[0] != pools.version:
            decoding: list[Request] = []
            reading: list[Request] = []
            for r in pools.running:  # `r.is_decoding`, inlined: every running request, every step
                output = r.output_tokens
                if r.status is RUNNING and output and len(r.prompt_tokens) + len(output) - r.num_computed_tokens == 1:
                    decoding.append(r)
                else:
                    reading.append(r)
            memo.split = pools.version, decoding, reading
        return memo.split[1], memo.split[2]

    def reading(self, pools: KVPools) -> list[Request]:
        """Every request in flight still reading its input: generating sequences, then embedding inputs
        (not to be changed: with no embedding input, `running`'s own list)."""
        reading = self.running(pools)[1]
        if not pools.embedding:
            return reading
        return [*reading, *(r for r in pools.embedding if not r.is_decoding)]

    def eligible(self, request) -> bool:
        """Waiting long enough to be admitted this step (a preempted request always is)."""
        return bool(request.num_preemptions) or request.arrival_time <= self.cutoffs[request.lane]


@dataclass(slots=True)
class Step(Moment):
    overdue: frozenset[str]  # background lanes served whatever the cost model says
    began_idle: bool  # nothing was running
    prompt: bool  # an interactive prompt is part-read, or an eligible one would be admitted now
    cells: dict[Pool, int]  # per generating pool, cells attended over (cached too)
    num_decoding: dict[Pool, int]  # per generating pool, sequences decoding
    decodes: StepShape  # the step's decodes as the cost model costs them
    deferred: int  # background decodes waiting for an interactive prompt
    pace: float | None  # the readers' inter-token pace (ms); None with no reader decoding
    aim: float  # the step's time target (ms)
    lone: bool  # nothing decodes this step: prompts alone, in longer steps
    held: bool  # an interactive output read whole decodes this step: a short aim
    first_token_waits: bool  # background may wait for an interactive first token this step
    min_chunk: int  # the smallest prefill chunk worth placing
    # Per (lane, member), the fair-share cost of the chunks placed so far: fair share's pick counts
    # it within the step; the counters are charged only once the step ran (`Scheduler.update`).
    planned: dict[tuple[str, str], float] = field(default_factory=dict)
