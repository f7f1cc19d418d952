"""Every error the service refuses with: `ServiceError` (status, message, code, param), below both the
API and the remote relay, and each error text written once.

The routes answer a ServiceError in their protocol's shape (OpenAI's `{"error": {...}}` by
`homeai.api.errors`, Ollama's `{"error": "..."}`, a socket's error event); `homeai.api.errors.ApiError`
is this same class. `from_engine` turns the engine's refusals into one; `retry_after` is the wait a
refused client is told.
"""

from __future__ import annotations

import math

from homeai.engine.engine import EngineStopped, InvalidRequest, PromptTooLong, QueueFull
from homeai.engine.state import EngineState
from homeai.engine.template import ChatRenderError
from homeai.wire import error_body

__all__ = ["ServiceError", "error_body", "from_engine", "retry_after", "TYPES"]

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error", 500: "server_error", 502: "server_error", 503: "server_error",
         504: "server_error"}
RETRY_SOON = {"Retry-After": "5"}  # a server loading or stopping: back in a few seconds


class ServiceError(Exception):
    """A refusal or failure, with the HTTP status that says it (sockets map it to their events)."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code, self.message, self.code, self.param = status, message, code, param
        self.type = type or TYPES.get(status, "invalid_request_error")
        self.headers = headers

    @property
    def status(self) -> int:
        return self.status_code

    def body(self) -> dict:
        """OpenAI's error object for this error."""
        return error_body(self.message, self.type, self.code, self.param)

    def __repr__(self) -> str:
        return f"ServiceError({self.status_code}, {self.message!r}, code={self.code!r})"


# ---- the texts said in more than one place -------------------------------------------------

def model_loading() -> ServiceError:
    return ServiceError(503, "the model is still loading; retry shortly", code="model_loading", headers=RETRY_SOON)


def model_unavailable(reason: str) -> ServiceError:
    return ServiceError(503, reason, code="model_unavailable")


def shutting_down() -> ServiceError:
    """An answer the server's stop cut short."""
    return ServiceError(503, "the server is shutting down; the answer was cut short", code="shutting_down",
                        headers=RETRY_SOON)


def generation_failed(reason: str | None) -> ServiceError:
    return ServiceError(500, f"generation failed: {reason}", code="generation_failed")


def embedding_failed(reason: str | None) -> ServiceError:
    return ServiceError(500, f"embedding failed: {reason}", code="embedding_failed")


def from_engine(exc: Exception, *, prompt_param: str, retry_after_s: int = 1) -> ServiceError:
    """The error for an engine refusal; `prompt_param` names where the prompt came from."""
    if isinstance(exc, PromptTooLong):
        return ServiceError(400, str(exc), code="context_length_exceeded", param=prompt_param)
    if isinstance(exc, InvalidRequest):
        param = prompt_param if exc.param in ("prompt", "messages") else exc.param
        return ServiceError(400, str(exc), code=exc.code, param=param)
    if isinstance(exc, ChatRenderError):  # the model's chat template refused these messages
        return ServiceError(400, str(exc), code="invalid_messages", param=prompt_param)
    if isinstance(exc, QueueFull):
        return ServiceError(429, str(exc), code="queue_full", param="lane", headers={"Retry-After": str(retry_after_s)})
    if isinstance(exc, EngineStopped):
        return ServiceError(503, str(exc), code="engine_stopped", headers=RETRY_SOON)
    raise TypeError(f"not an engine refusal: {exc!r}")


def retry_after(state: EngineState, lane: str) -> int:
    """Seconds a refused client should wait: the lane's recent median time to first token, at least 1."""
    known = state.lanes.get(lane)
    p50_ms = known.ttft_ms.p50 if known is not None else None
    return max(1, math.ceil((p50_ms or 0) / 1000.0))
