"""Who is asking: the bearer token's owner, the household's fair-share key.

A token is looked up (hashed) in the store by `homeai.store.members.authenticate`. With
`auth.required = false` (loopback only) a request without a token, or with a token that is
not a member's (OpenAI clients insist on sending some key), counts as the default member
`household`; a member's token still names its member.

Which lanes the caller may use is checked here too, for every route (`lane_for`, `allow_lane`):
a lane they may not use is a 403 `lane_not_allowed` naming the lanes they may
(`homeai.store.members.LaneNotAllowed`). The default member is an admin: every lane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header

from homeai.api.deps import RuntimeDep
from homeai.api.errors import ApiError
from homeai.store.members import LaneNotAllowed, allowed_lanes, authenticate, check_lane, ensure_default_member
from lanes.base import LanePolicy

CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True)
class Caller:
    name: str
    is_admin: bool
    member_id: int  # the member's row: routes scope their queries by it
    lanes: tuple[str, ...]  # the lanes they may use
    default_lane: str | None = None  # where their requests go when they name no lane (None: the route's own)


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
        return Caller(member.name, member.is_admin, member.id, allowed_lanes(member), default)


def lane_for(runtime, caller: Caller, name: str | None, default: str) -> tuple[str, LanePolicy]:
    """The lane a request asked for (`name`, else `default`) and its policy: a 400 when there is no
    such lane, a 403 when `caller` may not use it."""
    lane = name or default
    policy = runtime.cfg.lanes.get(lane)
    if policy is None:
        raise ApiError(400, f"unknown lane {lane!r} (known: {', '.join(runtime.cfg.lanes)})", code="unknown_lane",
                       param="lane")
    allow_lane(caller, lane)
    return lane, policy


def allow_lane(caller: Caller, lane: str) -> None:
    """A 403 naming the lanes `caller` may use, unless `lane` is one."""
    try:
        check_lane(caller.name, caller.lanes, lane)
    except LaneNotAllowed as e:
        raise ApiError(403, str(e), code="lane_not_allowed", param="lane") from None


CurrentMember = Annotated[Caller, Depends(current_member)]
