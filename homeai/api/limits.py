"""Limits on what a client controls, each refused with a clear error in OpenAI's shape.

* Request body size: `BodyLimit`, an ASGI middleware (413 over `server.max_body_bytes`). A declared
  Content-Length is checked before anything is read; a chunked body is counted as it arrives, and
  the count going over raises `RaisedInBody(ApiError)` from inside body parsing (FastAPI lets
  HTTPExceptions through there untouched, so the app's handler shapes it).
* Messages and answer length: the service's (`homeai.service.sampling.check_limits`: 400 over
  `server.max_messages` or `server.max_output_tokens`; answers also end at the context's edge, and
  prompts longer than the context are refused by the engine).
* Open sockets per member: `PerMember`, a counter the voice socket holds one unit of
  (`server.max_websockets_per_member`); until it has a token it holds one of its client
  address's instead (`server.max_unauthenticated_websockets_per_address`, another `PerMember`
  keyed by address). WebSocket message size is uvicorn's `ws_max_size`
  (`server.max_ws_message_bytes`, set by `homeai serve`); audio length is `speech.max_utterance_s`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from homeai.api.errors import ApiError, RaisedInBody, error_response


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
                    raise RaisedInBody(self._too_large(num_bytes))
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


class TooMany(Exception):
    """A member already holds as many units as allowed."""


class PerMember:
    """Counts what each member (or client address) holds open (voice sockets); thread-safe.

        with runtime.websockets.hold(caller.name):   # raises TooMany over the limit
            ... serve the socket ...
    """

    def __init__(self, max_per_member: int, what: str = "open WebSockets",
                 setting: str = "server.max_websockets_per_member"):
        self.max_per_member = max_per_member
        self.what, self.setting = what, setting
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, member: str) -> None:
        with self._lock:
            num = self.counts.get(member, 0)
            if num >= self.max_per_member:
                raise TooMany(f"{member} already has {num} {self.what}, the most allowed ({self.setting})")
            self.counts[member] = num + 1

    def release(self, member: str) -> None:
        with self._lock:
            num = self.counts.get(member, 0) - 1
            if num > 0:
                self.counts[member] = num
            else:
                self.counts.pop(member, None)

    @contextlib.contextmanager
    def hold(self, member: str) -> Iterator[None]:
        self.acquire(member)
        try:
            yield
        finally:
            self.release(member)

    def num_held(self, member: str) -> int:
        with self._lock:
            return self.counts.get(member, 0)
