"""What goes over the HTTP wire, shared by the API (homeai.api) and the remote relay (homeai.remote).

* Server-sent events: `sse(obj)` frames one JSON event, `DONE` is the `[DONE]` line every OpenAI
  stream ends with, `SSE_HEADERS` keep proxies from buffering a stream.
* OpenAI's error body: `error_body()` is `{"error": {"message", "type", "code", "param"}}`, the
  shape of every error homeai sends, in a response or as a stream's last event.

It lies below both so the relay needs nothing from the API: plain functions, no FastAPI.
"""

from __future__ import annotations

import json

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"


def sse(obj: dict) -> str:
    """One server-sent event carrying `obj` as compact JSON (non-ASCII text kept as it is)."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error object: `type` like "invalid_request_error", `code` a short machine name."""
    return {"error": {"message": message, "type": type, "code": code, "param": param}}
