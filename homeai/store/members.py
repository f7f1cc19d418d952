"""Household members, their default lanes and API tokens: adding, listing, revoking, authenticating.

A token is `hai_` plus 43 random URL-safe characters. It is shown once, when made;
the database keeps only its SHA-256 hex digest and a short prefix to list and revoke
it by. Every write commits. Bad names and unknown members raise `ValueError`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from homeai.store.models import Member, MemberSettings, Token, utcnow

TOKEN_MARK = "hai_"
# "hai_" plus 8 random characters: the mark alone would leave too few to tell tokens apart.
PREFIX_LEN = 12
DEFAULT_MEMBER = "household"
MAX_NAME_LEN = 64
MAX_LANE_LEN = 16
# last_used_at is for "which token is stale", so one write a minute is precise enough
# and spares SQLite a write on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_member(session: Session, *, name: str, admin: bool = False, lane: str | None = None) -> tuple[Member, str]:
    """A new member and their first token (plaintext, shown once); `lane`: their default lane
    (the caller checks it is a configured one: the store does not know the config)."""
    name = _valid_name(name)
    if _find(session, name) is not None:
        raise ValueError(f"member {name!r} already exists")
    member = Member(name=name, role="admin" if admin else "member")
    if lane is not None:
        member.settings = MemberSettings(default_lane=_valid_lane(lane))
    session.add(member)
    token = _new_token(member)
    session.commit()
    return member, token


def add_token(session: Session, *, name: str) -> str:
    """One more token for an existing member (plaintext, shown once)."""
    token = _new_token(_get(session, name))
    session.commit()
    return token


def set_default_lane(session: Session, *, name: str, lane: str | None) -> None:
    """Where `name`'s requests go when they name no lane; None: each endpoint's own default."""
    member = _get(session, name)
    member.settings = member.settings or MemberSettings()
    member.settings.default_lane = _valid_lane(lane)
    session.commit()


def default_lane(session: Session, *, member_id: int) -> str | None:
    return session.scalar(select(MemberSettings.default_lane).where(MemberSettings.member_id == member_id))


def list_members(session: Session) -> list[Member]:
    """Every member by name; `member.active_prefixes` lists their unrevoked tokens."""
    query = select(Member).options(selectinload(Member.tokens)).order_by(Member.name)
    return list(session.scalars(query))


def remove_member(session: Session, *, name: str) -> None:
    """Delete a member with their tokens and conversations."""
    session.delete(_get(session, name))
    session.commit()


def revoke(session: Session, *, name: str | None = None, prefix: str | None = None) -> int:
    """Revoke every active token of `name`, or the one token with `prefix`; returns how many."""
    if name is None and prefix is None:
        raise ValueError("revoke needs a member name, a token prefix, or both")
    query = select(Token).where(Token.revoked_at.is_(None))
    if name is not None:
        query = query.where(Token.member_id == _get(session, name).id)
    if prefix is not None:
        query = query.where(Token.prefix == prefix)
    tokens = list(session.scalars(query))
    if prefix is not None:
        _check_prefix_match(session, prefix, tokens)
    now = utcnow()
    for token in tokens:
        token.revoked_at = now
    session.commit()
    return len(tokens)


def _check_prefix_match(session: Session, prefix: str, tokens: list[Token]) -> None:
    if len(tokens) > 1:
        raise ValueError(f"prefix {prefix!r} matches {len(tokens)} tokens; revoke by member name")
    if not tokens and session.scalar(select(Token.id).where(Token.prefix == prefix)) is None:
        raise ValueError(f"no token with prefix {prefix!r}")


def authenticate(session: Session, token: str | None) -> Member | None:
    """The member owning this active token, or None; records when the token was used."""
    if not token or not token.startswith(TOKEN_MARK):
        return None
    query = (select(Token).options(selectinload(Token.member))
             .where(Token.token_hash == hash_token(token), Token.revoked_at.is_(None)))
    row = session.scalar(query)
    if row is None:
        return None
    now = utcnow()
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        row.last_used_at = now
        session.commit()
    return row.member


def revoked_among(session: Session, token_hashes: Collection[str]) -> set[str]:
    """Those of `token_hashes` (SHA-256 hex digests) whose token has been revoked."""
    query = select(Token.token_hash).where(Token.token_hash.in_(list(token_hashes)), Token.revoked_at.is_not(None))
    return set(session.scalars(query))


def ensure_default_member(session: Session) -> Member:
    """The admin member `household` that owns everything when auth is off."""
    member = _find(session, DEFAULT_MEMBER)
    if member is None:
        member = Member(name=DEFAULT_MEMBER, role="admin")
        session.add(member)
        session.commit()
    return member


def _new_token(member: Member) -> str:
    token = TOKEN_MARK + secrets.token_urlsafe(32)
    member.tokens.append(Token(token_hash=hash_token(token), prefix=token[:PREFIX_LEN]))
    return token


def _valid_name(name: str) -> str:
    name = name.strip()
    if not name:
        raise ValueError("member name must not be empty")
    if len(name) > MAX_NAME_LEN:
        raise ValueError(f"member name must be at most {MAX_NAME_LEN} characters")
    return name


def _valid_lane(lane: str | None) -> str | None:
    if lane is None:
        return None
    lane = lane.strip()
    if not lane or len(lane) > MAX_LANE_LEN:
        raise ValueError(f"a lane name has 1 to {MAX_LANE_LEN} characters")
    return lane


def _find(session: Session, name: str) -> Member | None:
    return session.scalar(select(Member).where(Member.name == name.strip()))


def _get(session: Session, name: str) -> Member:
    member = _find(session, name)
    if member is None:
        raise ValueError(f"no member named {name!r}")
    return member
