"""`GET /api/lanes`: each lane's policy and live state (queued, running, rejected, TTFT/ITL
p50/p95 over the recent window, the typical answer length that admission costs its readers
at), and the KV cache's use. A lane served by a remote server
also shows `remote`: its URL, requests waiting here and in flight there, failures, fallbacks."""

from __future__ import annotations

from fastapi import APIRouter

from homeai.api.auth import CurrentMember
from homeai.api.deps import EngineDep, RuntimeDep

router = APIRouter(prefix="/api", tags=["lanes"])


@router.get("/lanes")
async def lanes(engine: EngineDep, runtime: RuntimeDep, _member: CurrentMember) -> dict:
    # On the event loop, where the remote gates change: their counts are read whole.
    snapshot = engine.snapshot()
    for lane, remote in runtime.remotes.snapshot().items():
        snapshot["lanes"][lane]["remote"] = remote
    return snapshot
