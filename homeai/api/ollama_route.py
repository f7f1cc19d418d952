"""What every Ollama route shares: errors in Ollama's shape (`{"error": "..."}`), bodies read as
JSON whatever their content type, the router factory, and NDJSON lines.

Used by `homeai.api.ollama` (generation and embeddings) and `homeai.api.ollama_manage` (the
served model: version, tags, ps, show, pull).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from homeai.api.auth import current_member
from homeai.api.errors import ApiError
from homeai.wire import json_text

log = logging.getLogger("homeai.api")

NDJSON = "application/x-ndjson"


# ---- errors in Ollama's shape ---------------------------------------------------------------

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
ERROR_RESPONSES = {status: {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
                   for status, description in ((400, "The request is not valid"), (401, "Missing or invalid token"),
                                               (404, "The model is not served here"), (429, "The lane's queue is full"),
                                               (503, "Not loaded yet"))}


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class OllamaRoute(APIRoute):
    """A route whose errors, its dependencies' and body validation's included, are Ollama's `{"error": "..."}`,
    and whose body is JSON whatever its content type, as Ollama reads it (`curl -d` sends a form's)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        has_body = self.body_field is not None

        async def answer(request: Request) -> Response:
            if has_body:
                request = _as_json(request)
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc.status_code, exc.message, exc.headers)
            except RequestValidationError as exc:
                return error_response(400, _invalid(exc))
            except HTTPException as exc:
                return error_response(exc.status_code, str(exc.detail), exc.headers)
            except Exception:
                log.exception("unhandled error in %s", request.url.path)
                return error_response(500, "internal server error")

        return answer


def _as_json(request: Request) -> Request:
    """The request with its body declared JSON: FastAPI parses a body as JSON only when it says so."""
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
    scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}
    return Request(scope, request.receive)


def _invalid(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return "the body is not valid JSON"
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))


def ollama_router() -> APIRouter:
    """A router under `/api` whose routes answer errors as Ollama does, for members only."""
    return APIRouter(prefix="/api", tags=["ollama"], route_class=OllamaRoute, responses=ERROR_RESPONSES,
                     dependencies=[Depends(current_member)])


def line(obj: dict) -> str:
    """One NDJSON line: compact JSON, non-ASCII text kept as it is (`json_text`: the ollama package
    reads lines with httpx, which splits at U+2028 too)."""
    return json_text(obj) + "\n"


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
