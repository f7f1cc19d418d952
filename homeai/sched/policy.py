"""What a scheduling policy may change of the scheduler's rules: three questions, asked each step.

The scheduler asks its `Policy` for the order candidates go in, whether admission is open and
the step's budget, and otherwise applies its own rules (bounded by the lane classes it is
given). `HOMEAI` answers each with "the scheduler's own"; the benchmark's baselines
(`homeai/bench/policies.py`) answer otherwise.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from homeai.sched.request import Request


class Policy(Protocol):
    def order(self, partial: list[Request], waiting: dict[str, deque[Request]]) -> list[Request] | None:
        """This step's candidates (`partial`: admitted and still reading their input) in the
        order they must go, nothing overtaking one that cannot go; None: the scheduler's own
        order (interactive lanes first, then fair share within each class)."""
        ...

    def admission_open(self, *, num_running: int, num_admitted: int, began_idle: bool) -> bool:
        """A waiting request may be admitted now: `num_running` sequences run, `num_admitted`
        were admitted this step, and `began_idle` says whether the step began with none running."""
        ...

    def budget(self, max_step_tokens: int) -> int | None:
        """A fixed token budget for every step; None: the scheduler's own, from its cost model."""
        ...


class _Homeai:
    def order(self, partial: list[Request], waiting: dict[str, deque[Request]]) -> list[Request] | None:
        return None

    def admission_open(self, *, num_running: int, num_admitted: int, began_idle: bool) -> bool:
        return True

    def budget(self, max_step_tokens: int) -> int | None:
        return None


HOMEAI: Policy = _Homeai()
