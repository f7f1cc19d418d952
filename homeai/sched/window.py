"""Adaptive batching windows: when a waiting request may be admitted.

Interactive lanes admit at once when the engine is idle and wait their short window when
it is busy, so a burst joins one step. Background lanes wait up to their window unless
`max_batch` requests already wait, to form large batches.
"""

from __future__ import annotations

from lanes.base import LanePolicy


def eligible_at(policy: LanePolicy, arrival: float, *, engine_busy: bool, num_queued: int) -> float:
    """The clock time from which a request that arrived at `arrival` may be admitted."""
    window = policy.window_ms / 1000.0
    if policy.interactive:
        return arrival + window if engine_busy else arrival
    if num_queued >= policy.max_batch:
        return arrival
    return arrival + window
