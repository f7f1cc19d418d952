"""A request body larger than `server.max_body_bytes` is refused with 413, in the error shape.

A declared Content-Length is checked before anything is read; a chunked body is counted as
it arrives, and the count going over raises an `ApiError` from inside body parsing (FastAPI
lets HTTPExceptions through there untouched, so the app's handler shapes it).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from homeai.api.errors import ApiError, error_response


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await error_response(self._too_large(declared))(scope, receive, send)
        num_bytes = 0

        async def counted() -> Message:
            nonlocal num_bytes
            message = await receive()
            if message["type"] == "http.request":
                num_bytes += len(message.get("body", b""))
                if num_bytes > self.max_bytes:
                    raise self._too_large(num_bytes)
            return message

        await self.app(scope, counted, send)

    def _too_large(self, num_bytes: int) -> ApiError:
        return ApiError(413, f"the request body has {num_bytes} bytes, more than the {self.max_bytes} allowed",
                        code="request_too_large")


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
