"""Per-request statistics: one row per finished request (queue time, TTFT, end to end,
tokens in and out, preemptions, outcome), written by the engine for `bench` and `doctor`.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from homeai.store.models import RequestStat


def record_request(session: Session, **fields) -> RequestStat:
    """Store one request's statistics; an unknown field name raises TypeError."""
    stat = RequestStat(**fields)
    session.add(stat)
    session.commit()
    return stat


def recent_requests(session: Session, *, lane: str | None = None, limit: int = 100) -> list[RequestStat]:
    """The latest recorded requests, newest first, optionally of one lane."""
    query = select(RequestStat)
    if lane is not None:
        query = query.where(RequestStat.lane == lane)
    return list(session.scalars(query.order_by(RequestStat.id.desc()).limit(limit)))
