"""Who is asking: the bearer token's owner, the household's fair-share key.

A token is looked up (hashed) in the store by `homeai.store.members.authenticate`. With
`auth.required = false` (loopback only) a request without a token, or with a token that is
not a member's (OpenAI clients insist on sending some key), counts as the default member
`household`; a member's token still names its member.

Which lanes the caller may use is the service's to check (`homeai.service.rights`, where `Caller`
lives): a lane they may not use is a 403 `lane_not_allowed` naming the lanes they may. The
default member is an admin: every lane.

A member marked as a trusted proxy asks for the user its `[clients] proxy_user_header` names
(`homeai.service.clients.as_user`): the routes' `CurrentMember` is that user's caller, shared
fairly by a key of its own; anyone else's header is ignored.

The token of a request with a body is checked from its head (`HeadAuth`, an ASGI middleware),
before a byte of the body is read: without a valid token, its route answers 401 at once, in its own
shape, without waiting for the body, which uvicorn then drops as it comes, under the body's deadline
(`homeai.api.http_server`). A guest with a 4 MB body and no token costs a head's parse. The member
found there is the one the route's `current_member` gives: one lookup a request. Every route that
reads a body needs a member (the public ones, `/healthz`, the web UI's files and `/metrics`, are
GETs); a request without a body is checked by its route as before, and the voice socket (its token
may come in its first message) is not an HTTP request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from homeai.api.deps import RuntimeDep
from homeai.api.errors import ApiError, RaisedInBody
from homeai.service.clients import as_user
from homeai.service.rights import Caller
from homeai.store.members import allowed_lanes, authenticate, ensure_default_member, is_proxy

CHALLENGE = {"WWW-Authenticate": "Bearer"}
HEAD_AUTH = "homeai.auth"  # the scope key `HeadAuth` leaves its verdict under: a Caller, or the ApiError to answer


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when there is none or another scheme."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def current_member(runtime: RuntimeDep, authorization: Annotated[str | None, Header()] = None,
                   request: Request = None) -> Caller:
    """The member `HeadAuth` found (or its 401), else the header's. A plain function: FastAPI runs it
    in a worker thread, off the event loop (it may query the store)."""
    checked = request.scope.get(HEAD_AUTH) if request is not None else None
    if isinstance(checked, ApiError):
        raise checked
    if checked is not None:
        return checked
    return caller_of(runtime, header_token(authorization))


def header_token(authorization: str | None) -> str | None:
    """The bearer token of an Authorization header (None without one); a 401 for another scheme."""
    token = bearer(authorization)
    if authorization and token is None:
        raise ApiError(401, "the Authorization header must be 'Bearer <token>'", code="invalid_api_key",
                       headers=CHALLENGE)
    return token


def caller_of(runtime, token: str | None) -> Caller:
    """Who `token` (None: no token) names, or the default member where auth allows it; else a 401."""
    if token is None and runtime.cfg.auth.required:
        raise _missing_token()
    with runtime.sessions() as session:
        member = authenticate(session, token)
        if member is None:
            if runtime.cfg.auth.required:
                raise ApiError(401, "invalid or revoked token", code="invalid_api_key", headers=CHALLENGE)
            member = ensure_default_member(session)
        default = member.settings.default_lane if member.settings else None
        return Caller(member.name, member.is_admin, member.id, allowed_lanes(member), default, is_proxy(member))


async def current_caller(request: Request, runtime: RuntimeDep,
                         member: Annotated[Caller, Depends(current_member)]) -> Caller:
    """The member, or the user a trusted proxy member asks for (a 400 naming the header for a bad one);
    on the event loop: it reads nothing but the request."""
    header = runtime.cfg.clients.proxy_user_header
    return as_user(member, header, request.headers.get(header) if header else None)


CurrentMember = Annotated[Caller, Depends(current_caller)]


def _missing_token() -> ApiError:
    return ApiError(401, "missing bearer token (Authorization: Bearer hai_...)", code="missing_token",
                    headers=CHALLENGE)


class HeadAuth:
    """ASGI middleware: a request that announces a body has its token checked from its head. Refused,
    it reaches its route with a body that cannot be read: the route answers the 401 in its own shape
    (OpenAI's, Ollama's), from `current_member` or from reading its body, and never reads the real one."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _announces_body(scope):
            try:
                scope[HEAD_AUTH] = await _member_from_head(scope["app"].state.runtime, scope)
            except ApiError as error:
                scope[HEAD_AUTH], receive = error, _unreadable(error)
        await self.app(scope, receive, send)


def _announces_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


async def _member_from_head(runtime, scope: Scope) -> Caller:
    """The request's member, its cheap refusals answered on the event loop, the store asked in a worker thread."""
    token = header_token(Headers(scope=scope).get("authorization"))
    if token is None and runtime.cfg.auth.required:
        raise _missing_token()
    return await run_in_threadpool(caller_of, runtime, token)


def _unreadable(error: ApiError) -> Receive:
    """A body that answers `error` when read (raised as FastAPI's body parsing lets through): the real
    one is never asked for."""

    async def receive() -> Message:
        raise RaisedInBody(error)

    return receive
