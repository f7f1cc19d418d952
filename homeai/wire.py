"""What goes over the HTTP wire, shared by the API (homeai.api) and the remote relay (homeai.remote).

* Server-sent events: `sse(obj)` frames one JSON event (`json_text`: one line whatever a client
  splits lines by; NDJSON uses it too), `DONE` is the `[DONE]` line every OpenAI
  stream ends with, `SSE_HEADERS` keep proxies from buffering a stream.
* OpenAI's error body: `error_body()` is `{"error": {"message", "type", "code", "param"}}`, the
  shape of every error homeai sends, in a response or as a stream's last event.

It lies below both so the relay needs nothing from the API: plain functions, no FastAPI.
"""

from __future__ import annotations

import json

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"


# Characters JSON lets stand in a string that Python's str.splitlines and httpx's line reader (the
# ollama package's, Home Assistant's) take for line ends: raw in an SSE or NDJSON line, a client
# splitting lines cut the event in two (a member's text or the model's with U+2028 in it).
LINE_BREAKS_IN_STRINGS = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPES = str.maketrans(LINE_BREAKS_IN_STRINGS)


def json_text(obj) -> str:
    """Compact JSON on one line whatever a client splits lines by: non-ASCII text kept as it is,
    but for the line breaks JSON does not escape (`LINE_BREAKS_IN_STRINGS`)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).translate(_ESCAPES)


def sse(obj: dict) -> str:
    """One server-sent event carrying `obj` as compact JSON on one line (`json_text`)."""
    return f"data: {json_text(obj)}\n\n"


def error_body(message: str, type: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error object: `type` like "invalid_request_error", `code` a short machine name."""
    return {"error": {"message": message, "type": type, "code": code, "param": param}}
