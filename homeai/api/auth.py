"""Who is asking: the bearer token's owner, the household's fair-share key.

A token is looked up (hashed) in the store by `homeai.store.members.authenticate`. With
`auth.required = false` (loopback only) a request without a token, or with a token that is
not a member's (OpenAI clients insist on sending some key), counts as the default member
`household`; a member's token still names its member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header

from homeai.api.deps import RuntimeDep
from homeai.api.errors import ApiError
from homeai.store.members import DEFAULT_MEMBER, authenticate

CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass(frozen=True)
class Caller:
    name: str
    is_admin: bool


def current_member(runtime: RuntimeDep, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """A plain function: FastAPI runs it in a worker thread, off the event loop (it queries the store)."""
    if not authorization:
        if runtime.cfg.auth.required:
            raise ApiError(401, "missing bearer token (Authorization: Bearer hai_...)", code="missing_token",
                           headers=CHALLENGE)
        return Caller(DEFAULT_MEMBER, True)
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "the Authorization header must be 'Bearer <token>'", code="invalid_api_key",
                       headers=CHALLENGE)
    with runtime.sessions() as session:
        member = authenticate(session, token.strip())
        caller = Caller(member.name, member.is_admin) if member is not None else None
    if caller is None:
        if not runtime.cfg.auth.required:
            return Caller(DEFAULT_MEMBER, True)
        raise ApiError(401, "invalid or revoked token", code="invalid_api_key", headers=CHALLENGE)
    return caller


CurrentMember = Annotated[Caller, Depends(current_member)]
