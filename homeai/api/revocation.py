"""A revoked token ends what it already opened: voice sockets and HTTP requests in flight.

`homeai members revoke` writes `revoked_at` into the database from another process; nothing
tells the daemon. So every token in use is held here while its socket or request lasts
(`hold`), and `watch` asks the database every `CHECK_INTERVAL_S` seconds, in one query, which
held tokens are revoked now; each of their holds has its `revoked` event set:

* a voice socket closes with 4401 and aborts its turn (`homeai.api.voice`, which also checks
  its token again before each turn);
* an HTTP request sees its client leave (`RevocationMiddleware`), the routes' own disconnect
  path, which aborts its sequences; it gets 401 `token_revoked` when no answer had started,
  and a streamed answer ends where it was.

Only a revocation ends a hold: a token the database does not know (auth off accepts any key
as the default member) is never ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sqlalchemy.orm import Session
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from homeai.api.auth import CHALLENGE, bearer
from homeai.api.errors import ApiError, error_response
from homeai.store.members import TOKEN_MARK, hash_token, revoked_among

log = logging.getLogger("homeai.api")

CHECK_INTERVAL_S = 2.0  # how long a revoked token's socket or request may still run, at most
DISCONNECT = {"type": "http.disconnect"}


@dataclass(eq=False)
class Hold:
    token_hash: str
    revoked: asyncio.Event = field(default_factory=asyncio.Event)


class Revocations:
    """The tokens held by open sockets and requests in flight, and the watch over them."""

    def __init__(self):
        self._holds: dict[str, set[Hold]] = {}

    def hold(self, token: str) -> Hold:
        hold = Hold(hash_token(token))
        self._holds.setdefault(hold.token_hash, set()).add(hold)
        return hold

    def release(self, hold: Hold) -> None:
        holds = self._holds.get(hold.token_hash, set())
        holds.discard(hold)
        if not holds:
            self._holds.pop(hold.token_hash, None)

    @contextlib.contextmanager
    def holding(self, token: str) -> Iterator[Hold]:
        hold = self.hold(token)
        try:
            yield hold
        finally:
            self.release(hold)

    async def watch(self, sessions: Callable[[], Session]) -> None:
        """Check the held tokens every CHECK_INTERVAL_S until cancelled."""
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            if self._holds:
                try:
                    await self.check(sessions)
                except Exception:  # a busy or broken database: try again next time
                    log.warning("could not check held tokens for revocation", exc_info=True)

    async def check(self, sessions: Callable[[], Session]) -> None:
        revoked = await asyncio.to_thread(revoked_tokens, sessions, list(self._holds))
        for token_hash in revoked:
            for hold in self._holds.get(token_hash, ()):
                hold.revoked.set()


def revoked_tokens(sessions: Callable[[], Session], token_hashes: list[str]) -> set[str]:
    """Those of the held `token_hashes` revoked by now (a query; call it off the event loop)."""
    with sessions() as session:
        return revoked_among(session, token_hashes)


class RevocationMiddleware:
    """Holds an HTTP request's bearer token while it runs; once revoked, the request's client
    seems to leave and the client gets 401 `token_revoked` (or the end of what had started)."""

    def __init__(self, app: ASGIApp, revocations: Revocations):
        self.app, self.revocations = app, revocations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _member_token(scope) if scope["type"] == "http" else None
        if token is None:
            return await self.app(scope, receive, send)
        with self.revocations.holding(token) as hold:
            response = _Response(send, hold)
            await self.app(scope, _until_revoked(receive, hold), response.send)
            if hold.revoked.is_set():
                await response.end(scope)


class _Response:
    """Passes the app's response through until the token is revoked, then ends it: a 401 when
    nothing was sent yet, else an empty last chunk (what the app sends meanwhile is dropped)."""

    def __init__(self, send: Send, hold: Hold):
        self._send, self.hold = send, hold
        self.started = self.ended = False

    async def send(self, message: Message) -> None:
        if self.hold.revoked.is_set():
            return
        self.started = True
        self.ended = message["type"] == "http.response.body" and not message.get("more_body", False)
        await self._send(message)

    async def end(self, scope: Scope) -> None:
        if self.ended:
            return
        self.ended = True
        if self.started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        revoked = ApiError(401, "this token has been revoked", code="token_revoked", headers=CHALLENGE)
        await error_response(revoked)(scope, _nothing, self._send)


def _until_revoked(receive: Receive, hold: Hold) -> Receive:
    async def wrapped() -> Message:
        if hold.revoked.is_set():
            return DISCONNECT
        message = asyncio.ensure_future(receive())
        revoked = asyncio.ensure_future(hold.revoked.wait())
        try:
            await asyncio.wait({message, revoked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            revoked.cancel()
            if not message.done():
                message.cancel()
        return message.result() if message.done() and not message.cancelled() else DISCONNECT

    return wrapped


async def _nothing() -> Message:
    return DISCONNECT


def _member_token(scope: Scope) -> str | None:
    token = bearer(Headers(scope=scope).get("authorization"))
    return token if token is not None and token.startswith(TOKEN_MARK) else None
