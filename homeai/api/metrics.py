"""`GET /metrics`: the app's Prometheus registry (`api/prometheus.py`) as text, for those who may read it.

When auth is required, scraping needs a member's bearer token (a member made for Prometheus will
do), unless `server.metrics_public` opens it to anyone who reaches the port.

Token counts (prompt and output tokens, the prompt cache's, KV cells) and the families moved
once a token (the ITL histogram, engine steps) are an admin's: between two scrapes they tell the
length of each prompt and answer of another member (`prometheus.admin_only`). A scrape with
another member's token, or none (`metrics_public`), gets the rest, per request: requests by
outcome, queue, TTFT and end-to-end times, queues, running sequences, rejections. A Prometheus
that should record every figure scrapes with an admin's token.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from homeai.api.auth import current_member

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, authorization: Annotated[str | None, Header()] = None) -> Response:
    """Any member's token may scrape when auth is required, anyone with `server.metrics_public`;
    the token counts and per-token families only an admin (or, with auth off, the household)."""
    runtime = request.app.state.runtime
    if authorization is None and runtime.cfg.server.metrics_public and runtime.cfg.auth.required:
        admin = False
    else:
        admin = current_member(runtime, authorization).is_admin  # 401 without a valid token when auth is required
    return Response(runtime.metrics.render(admin=admin), media_type=CONTENT_TYPE_LATEST)
