"""`GET /api/lanes`: each lane's policy and live state (queued, running, rejected, TTFT/ITL
p50/p95 over the recent window, the typical answer length that admission costs its readers
at, the prompt cache's hit rate, the tokens drafted and accepted and the draft length), and each KV cache's use (cells live and cached). A lane
served by a remote server also shows `remote`: its URL, requests waiting here and in flight
there, failures, fallbacks.

An admin sees every figure. Another member sees nothing that counts the tokens of other
members' prompts or answers, since the changes between two polls would give them away: each
lane's `prompt_cache` and `drafting` (tokens drafted and accepted: how much an answer echoed its
prompt) are the caller's own requests', the KV cells are rounded to `COARSE_CELLS`
(a cache's cells move by a whole prompt and answer at once, not a token at a time), and
`ADMIN_ONLY` is left out: the engine's `steps` (once a decode step: an answer alone on the box
moves it by its tokens + 1 or 2), each lane's `typical_output_tokens` (learnt from the lengths
of the latest answers) and each cache's `entries` (one more per finished generation kept).
Queues, running sequences, finished requests and latency percentiles say how busy the box is,
as any member's own requests would show it, and stay (`api/prometheus.py` keeps the same rule).

An admin also sees who is using the box (`members`, issue 54): one row for each member, and for
each user a trusted proxy names (`member/user`), with anything running, waiting, cached or
finished in the last hour: requests running and waiting, the tokens of the last hour (prompt,
found cached, generated), the cells its live sequences hold and its cached prefixes keep
(`homeai.engine.usage`). Counts only, never a prompt's text; nobody else sees the rows.
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from homeai.api.auth import Caller, CurrentMember
from homeai.api.deps import ServiceDep
from homeai.engine import usage
from homeai.engine.state import EngineState, LaneState

router = APIRouter(prefix="/api", tags=["lanes"])

COARSE_CELLS = 256  # a non-admin's KV cell counts, rounded to this: no single prompt's length shows
CELL_KEYS = ("cells_used", "cells_cached")
ADMIN_ONLY = ("steps", "typical_output_tokens", "entries")  # left out of a non-admin's view


@router.get("/lanes")
async def lanes(service: ServiceDep, member: CurrentMember) -> dict:
    # On the event loop, where the remote gates change: their counts are read whole.
    view = lanes_view(service.state(), member)
    for lane, remote in service.remotes.snapshot().items():
        view["lanes"][lane]["remote"] = remote
    if member.is_admin:
        view["members"] = members_view(service.members_using())
    return view


def members_view(uses: dict[str, usage.MemberUse]) -> list[dict]:
    """The rows of who is using the box, by key: a member, or a proxy's user within it."""
    rows = []
    for key, use in uses.items():
        name, _, user = key.partition("/")
        rows.append({"key": key, "member": name, "user": user or None, "running": use.running,
                     "waiting": use.waiting, "tokens_hour": {"prompt": use.prompt_tokens_hour,
                                                             "cached": use.cached_tokens_hour,
                                                             "output": use.output_tokens_hour},
                     "cells_used": use.cells_used, "cells_cached": use.cells_cached})
    return rows


def lanes_view(state: EngineState, caller: Caller | None = None) -> dict:
    """The engine's state as `/api/lanes` shows it to `caller` (None: an admin's view)."""
    member = None if caller is None or caller.is_admin else caller.key  # a proxy's user: their own
    caches = {name: _coarse(asdict(c), member) for name, c in state.caches.items()}
    kv = _coarse({key: state.total(key) for key in caches["main"]}, member)  # totals over the caches
    kv["caches"] = caches
    view = {"lanes": {name: _lane(lane, member) for name, lane in state.lanes.items()}, "kv": kv,
            "steps": state.steps, "step_cost_ms": state.step_cost_ms}
    return view if member is None else _members_view(view)


def _lane(lane: LaneState, member: str | None) -> dict:
    policy = {k: v for k, v in asdict(lane.policy).items() if k != "name"}
    cache = lane.prompt_cache if member is None else lane.prompt_cache_of(member)
    drafting = lane.drafting if member is None else lane.drafting_of(member)
    return {"policy": policy, "queued": lane.queued, "running": lane.running, "rejected": lane.rejected,
            "typical_output_tokens": lane.typical_output_tokens, "reading_pace_ms": lane.reading_pace_ms,
            "finished": lane.finished, "ttft_ms": asdict(lane.ttft_ms), "itl_ms": asdict(lane.itl_ms),
            "prompt_cache": {**asdict(cache), "hit_rate": round(cache.hit_rate, 4)},
            "drafting": {**asdict(drafting), "acceptance": round(drafting.acceptance, 4)}}


def _members_view(view: dict) -> dict:
    """`view` without the `ADMIN_ONLY` keys, at any depth."""
    if isinstance(view, dict):
        return {k: _members_view(v) for k, v in view.items() if k not in ADMIN_ONLY}
    return view


def _coarse(cells: dict, member: str | None) -> dict:
    """A cache's figures; for a member who is not an admin (`member` set), cells rounded to `COARSE_CELLS`."""
    if member is None:
        return cells
    return {k: (round(v / COARSE_CELLS) * COARSE_CELLS if k in CELL_KEYS else v) for k, v in cells.items()}
