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
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from homeai.api.deps import RuntimeDep
from homeai.api.errors import ApiError
from homeai.service.clients import as_user
from homeai.service.rights import Caller
from homeai.store.members import allowed_lanes, authenticate, ensure_default_member, is_proxy

CHALLENGE = {"WWW-Authenticate": "Bearer"}


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when there is none or another scheme."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def current_member(runtime: RuntimeDep, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """A plain function: FastAPI runs it in a worker thread, off the event loop (it queries the store)."""
    token = bearer(authorization)
    if authorization and token is None:
        raise ApiError(401, "the Authorization header must be 'Bearer <token>'", code="invalid_api_key",
                       headers=CHALLENGE)
    return caller_of(runtime, token)


def caller_of(runtime, token: str | None) -> Caller:
    """Who `token` (None: no token) names, or the default member where auth allows it; else a 401."""
    if token is None and runtime.cfg.auth.required:
        raise ApiError(401, "missing bearer token (Authorization: Bearer hai_...)", code="missing_token",
                       headers=CHALLENGE)
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
