"""Every error the API sends, in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`.

`ApiError` is what routes raise: the service's `ServiceError` (homeai.service.errors, where
`from_engine` turns the engine's refusals into one). `install` puts the handlers on an app so
FastAPI's own errors (validation, unknown routes, crashes) come out in the same shape.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from homeai.service.errors import ServiceError

log = logging.getLogger("homeai.api")

CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}

ApiError = ServiceError  # what routes raise: the service's error, answered in OpenAI's shape here


class RaisedInBody(HTTPException):
    """An ApiError raised where only an HTTPException passes through untouched: inside FastAPI's
    body parsing (the body-size limit raises it there)."""

    def __init__(self, error: ApiError):
        super().__init__(error.status_code, error.message, error.headers)
        self.error = error


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)


async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc)


async def _http_error(_request: Request, exc: HTTPException) -> JSONResponse:
    if isinstance(exc, RaisedInBody):
        return error_response(exc.error)
    if exc.status_code == 400:  # our own 400s are ApiErrors: this is FastAPI's, for a body it could not parse
        return error_response(_unparsable(exc))
    error = ApiError(exc.status_code, str(exc.detail), code=CODES.get(exc.status_code), headers=exc.headers)
    return error_response(error)


def _unparsable(exc: HTTPException) -> ApiError:
    """Why a body could not be parsed; FastAPI says only "There was an error parsing the body"."""
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return ApiError(400, "the body is not valid JSON: it is nested too deeply", code="invalid_json")
    if isinstance(cause, ValueError):  # not UTF-8, or an integer of thousands of digits
        return ApiError(400, f"the body is not valid JSON: {cause}", code="invalid_json")
    return ApiError(400, str(exc.detail), code="invalid_body")  # a malformed form, say


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "JSON decode error")
        return error_response(ApiError(400, f"the body is not valid JSON: {reason}", code="invalid_json"))
    path = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(path) or None
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    more = len(exc.errors()) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    return error_response(ApiError(400, message, code="invalid_value", param=param))


async def _crash(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error", exc_info=exc)
    return error_response(ApiError(500, "internal server error", code="internal_error"))


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _crash)
    build = app.openapi  # FastAPI's own document, then ours on top of it, once
    app.openapi = lambda: app.openapi_schema or _document_errors(build())


# ---- the OpenAPI document -------------------------------------------------------------

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "code": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]}}}}}
EVERY_OPERATION = {"413": "The request body is too large", "503": "Not loaded yet, or shutting down"}
DISPATCHED = {"404": "The model does not exist", "429": "The lane's queue is full (Retry-After)",
              "502": "The lane's remote server failed", "504": "The lane's remote server did not answer in time"}
DISPATCHED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
LANE_CHECKED = ("/messages", "/regenerate")  # the household's answers, on the chat lane without a lane header


def _document_errors(doc: dict) -> dict:
    """FastAPI's document, told the truth about errors: homeai answers them all in OpenAI's shape,
    and a body or parameter that does not validate with 400, never FastAPI's 422."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = ERROR_SCHEMA
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            _error_responses(path, operation)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return doc


def _error_responses(path: str, operation: dict) -> None:
    responses = operation.setdefault("responses", {})
    had_validation = responses.pop("422", None) is not None
    statuses = dict(EVERY_OPERATION)
    if had_validation:
        statuses["400"] = "The request is not valid"
    if any(p.get("name") == "authorization" for p in operation.get("parameters", ())):
        statuses["401"] = "Missing or invalid bearer token"
    if "{" in path:
        statuses["404"] = "Not found"
    if path in DISPATCHED_PATHS:
        statuses.update(DISPATCHED)
    if path.endswith(LANE_CHECKED) or any(p.get("name") == "X-HomeAI-Lane" for p in operation.get("parameters", ())):
        statuses["403"] = "A lane the member may not use (the message names those they may)"
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for status, description in statuses.items():
        responses.setdefault(status, {"description": description, "content": ref})
