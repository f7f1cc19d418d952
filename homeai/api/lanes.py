"""`GET /api/lanes`: each lane's policy and live state (queued, running, rejected, TTFT/ITL
p50/p95 over the recent window, the typical answer length that admission costs its readers
at, the prompt cache's hit rate), and each KV cache's use (cells live and cached). A lane
served by a remote server also shows `remote`: its URL, requests waiting here and in flight
there, failures, fallbacks."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from homeai.api.auth import CurrentMember
from homeai.api.deps import EngineDep, RuntimeDep
from homeai.engine.state import EngineState, LaneState

router = APIRouter(prefix="/api", tags=["lanes"])


@router.get("/lanes")
async def lanes(engine: EngineDep, runtime: RuntimeDep, _member: CurrentMember) -> dict:
    # On the event loop, where the remote gates change: their counts are read whole.
    view = lanes_view(engine.state())
    for lane, remote in runtime.remotes.snapshot().items():
        view["lanes"][lane]["remote"] = remote
    return view


def lanes_view(state: EngineState) -> dict:
    """The engine's state as `/api/lanes` shows it."""
    caches = {name: asdict(c) for name, c in state.caches.items()}
    kv = {key: state.total(key) for key in caches["main"]}  # totals over the caches
    kv["caches"] = caches
    return {"lanes": {name: _lane(lane) for name, lane in state.lanes.items()}, "kv": kv, "steps": state.steps,
            "step_cost_ms": state.step_cost_ms}


def _lane(lane: LaneState) -> dict:
    policy = {k: v for k, v in asdict(lane.policy).items() if k != "name"}
    cache = lane.prompt_cache
    return {"policy": policy, "queued": lane.queued, "running": lane.running, "rejected": lane.rejected,
            "typical_output_tokens": lane.typical_output_tokens, "reading_pace_ms": lane.reading_pace_ms,
            "finished": lane.finished, "ttft_ms": asdict(lane.ttft_ms), "itl_ms": asdict(lane.itl_ms),
            "prompt_cache": {**asdict(cache), "hit_rate": round(cache.hit_rate, 4)}}
