"""`GET /api/lanes`: each lane's policy and live state (queued, running, rejected, TTFT/ITL
p50/p95 over the recent window), and the KV cache's use."""

from __future__ import annotations

from fastapi import APIRouter

from homeai.api.auth import CurrentMember
from homeai.api.deps import EngineDep

router = APIRouter(prefix="/api", tags=["lanes"])


@router.get("/lanes")
def lanes(engine: EngineDep, _member: CurrentMember) -> dict:
    return engine.snapshot()
