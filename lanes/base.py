"""The lane policy: the knobs every lane has, read by the scheduler as plain data."""

from __future__ import annotations

from dataclasses import dataclass

INTERACTIVE = "interactive"
BACKGROUND = "background"


class ServerText(str):
    """A message's text the server wrote, not a member (a lane's configured prompt): the chat
    template's rendering (homeai/engine/template.py) tokenizes it as plain text, and counts it in
    the prompt's public prefix when nothing a member wrote comes before it."""


@dataclass(frozen=True)
class LanePolicy:
    name: str
    lane_class: str  # INTERACTIVE lanes take latency priority; BACKGROUND lanes share what is left
    priority: int  # among interactive lanes, lower goes first (voice before chat)
    weight: float  # fair-share weight: a higher weight gets more tokens of its class
    window_ms: float  # how long a new request may wait to be batched with others
    max_batch: int  # a background lane admits as soon as this many requests wait
    max_queue: int  # waiting requests beyond this are refused (HTTP 429)
    ttft_target_ms: float  # time-to-first-token goal, used by goodput and the lane view
    itl_target_ms: float  # inter-token-latency goal: bounds the step length while this lane decodes
    max_tokens: int  # output cap when a request names none (0: none, the answer runs to its end or its cache's room)

    @property
    def interactive(self) -> bool:
        return self.lane_class == INTERACTIVE
