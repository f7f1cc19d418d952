"""Per-request measurements and the recent window per lane that the lane view and metrics read."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from homeai.sched.request import Request


@dataclass(frozen=True)
class RequestStats:
    request_id: str
    lane: str
    member: str
    kind: str
    outcome: str  # stop | length | abort | error
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int  # prompt tokens found in the prompt cache, not computed
    queue_ms: float | None  # arrival to admission
    ttft_ms: float | None  # arrival to first token (embeddings: to the vector)
    e2e_ms: float
    itls_ms: tuple[float, ...]
    preemptions: int

    @classmethod
    def of(cls, request: Request, outcome: str, now: float) -> "RequestStats":
        def ms(t):
            return None if t is None else (t - request.arrival_time) * 1000.0
        return cls(request.request_id, request.lane, request.member, request.kind.value, outcome,
                   request.num_prompt_tokens, len(request.output_tokens), request.num_cached_tokens,
                   ms(request.admitted_time),
                   ms(request.first_token_time), ms(request.finish_time or now),
                   tuple(x * 1000.0 for x in request.itls), request.num_preemptions)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(int(round(q / 100.0 * (len(ordered) - 1))), len(ordered) - 1)
    return ordered[k]


class LaneWindow:
    """The last few minutes of finished requests of one lane."""

    def __init__(self, seconds: float = 300.0, maxlen: int = 2048):
        self.seconds = seconds
        self.items: deque[tuple[float, RequestStats]] = deque(maxlen=maxlen)

    def add(self, stats: RequestStats) -> None:
        self.items.append((time.monotonic(), stats))

    def summary(self) -> dict:
        cutoff = time.monotonic() - self.seconds
        recent = [s for t, s in self.items if t >= cutoff]
        ttft = [s.ttft_ms for s in recent if s.ttft_ms is not None]
        itl = [x for s in recent for x in s.itls_ms]
        return {
            "finished": len(recent),
            "ttft_ms": {"p50": percentile(ttft, 50), "p95": percentile(ttft, 95)},
            "itl_ms": {"p50": percentile(itl, 50), "p95": percentile(itl, 95)},
        }
