"""Household members, their lanes and API tokens: adding, listing, revoking, authenticating.

A token is `hai_` plus 43 random URL-safe characters. It is shown once, when made;
the database keeps only its SHA-256 hex digest and a short prefix to list and revoke
it by. Every write commits. Bad names and unknown members raise `ValueError`.

Lanes a member may use: an admin, every lane (the default member `household`, who owns the
box when auth is off, is one); any other member, the lanes stored for them, by default chat
and the background lanes, and voice only when asked for (`--lanes`, or `--lane voice`, a
default lane being one they may use). `LaneNotAllowed` is the one refusal every route,
the voice socket and Wyoming report.

A trusted proxy (`--proxy`, `set_proxy`): a member whose token a tool such as Open WebUI uses for
all its users; the user it names in `[clients] proxy_user_header` is then the key they are shared
fairly by (`homeai.service.clients`). Its own lanes and limits still apply to every user.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection, Iterable
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from homeai.store.models import Member, MemberSettings, Token, utcnow
from lanes import DEFAULT_POLICIES

TOKEN_MARK = "hai_"
# "hai_" plus 8 random characters: the mark alone would leave too few to tell tokens apart.
PREFIX_LEN = 12
DEFAULT_MEMBER = "household"
MAX_NAME_LEN = 64
MAX_LANE_LEN = 16
# last_used_at is for "which token is stale", so one write a minute is precise enough
# and spares SQLite a write on every request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
ALL_LANES = tuple(DEFAULT_POLICIES)  # voice, chat, summaries, indexing, embeddings
# A member's lanes unless told otherwise: voice is for voice clients (Home Assistant's member).
DEFAULT_LANES = ("chat", "summaries", "indexing", "embeddings")


class LaneNotAllowed(ValueError):
    """A member asked for a lane they may not use; the message names the lanes they may."""

    def __init__(self, member: str, lane: str, allowed: Iterable[str]):
        self.member, self.lane, self.allowed = member, lane, tuple(allowed)
        super().__init__(f"member {member!r} may not use lane {lane!r} (allowed: {', '.join(self.allowed)}); "
                         f"an admin can change that with `homeai members lanes {member} LANE,...`")


def check_lane(member: str, allowed: Collection[str], lane: str) -> None:
    """Raise `LaneNotAllowed` unless `lane` is among the `allowed` lanes of `member` (a name)."""
    if lane not in allowed:
        raise LaneNotAllowed(member, lane, allowed)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_member(session: Session, *, name: str, admin: bool = False, lane: str | None = None,
               lanes: Iterable[str] | None = None, proxy: bool = False) -> tuple[Member, str]:
    """A new member and their first token (plaintext, shown once); `lane`: their default lane,
    `lanes`: the lanes they may use (None: `DEFAULT_LANES` and the default lane; an admin may
    use every lane, so `lanes` is refused for one); `proxy`: a trusted proxy."""
    name = _valid_name(name)
    if _find(session, name) is not None:
        raise ValueError(f"member {name!r} already exists")
    lane = _valid_lane(lane)
    member = Member(name=name, role="admin" if admin else "member")
    if admin:
        if lanes is not None:
            raise ValueError("an admin may use every lane: --lanes is for other members")
        if lane is not None:
            member.settings = MemberSettings(default_lane=_known_lane(lane))
    else:
        allowed = valid_lanes(DEFAULT_LANES + ((lane,) if lane else ()) if lanes is None else lanes)
        if lane is not None:
            check_lane(name, allowed, _known_lane(lane))
        member.settings = MemberSettings(default_lane=lane, lanes=",".join(allowed))
    if proxy:
        _settings(member).proxy = True
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
    """Where `name`'s requests go when they name no lane; None: each endpoint's own default.
    A lane the member may not use is refused (`LaneNotAllowed`)."""
    member = _get(session, name)
    lane = _valid_lane(lane)
    if lane is not None:
        check_lane(member.name, allowed_lanes(member), _known_lane(lane))
    _settings(member).default_lane = lane
    session.commit()


def set_lanes(session: Session, *, name: str, lanes: Iterable[str]) -> tuple[str, ...]:
    """The lanes `name` may use from now on (what each new request and voice session is checked
    against); their default lane must stay among them. Returns them in the lanes' order."""
    member = _get(session, name)
    if member.is_admin:
        raise ValueError(f"{member.name!r} is an admin and may use every lane")
    allowed = valid_lanes(lanes)
    current = member.settings.default_lane if member.settings else None
    if current is not None and current not in allowed:
        raise ValueError(f"{member.name!r}'s default lane {current!r} would not be allowed: "
                         f"change it first (`homeai members lane {member.name} LANE`, or none to clear it)")
    _settings(member).lanes = ",".join(allowed)
    session.commit()
    return allowed


def set_proxy(session: Session, *, name: str, proxy: bool) -> None:
    """Mark `name` as a trusted proxy (its users' header counts) or not."""
    _settings(_get(session, name)).proxy = proxy
    session.commit()


def is_proxy(member: Member) -> bool:
    return bool(member.settings and member.settings.proxy)


def allowed_lanes(member: Member) -> tuple[str, ...]:
    """The lanes `member` may use: every lane for an admin, else those stored (`DEFAULT_LANES` if none are)."""
    if member.is_admin:
        return ALL_LANES
    stored = member.settings.lanes if member.settings else None
    return tuple(stored.split(",")) if stored else DEFAULT_LANES


def lanes_of(session: Session, *, name: str) -> tuple[str, ...]:
    """The lanes the member named `name` may use (`ValueError` when there is no such member)."""
    return allowed_lanes(_get(session, name))


def _settings(member: Member) -> MemberSettings:
    """The member's settings row, made (with the lanes they may use now) when they have none."""
    if member.settings is None:
        member.settings = MemberSettings(lanes=None if member.is_admin else ",".join(allowed_lanes(member)))
    return member.settings


def valid_lanes(lanes: Iterable[str]) -> tuple[str, ...]:
    """`lanes` checked (known names, at least one), without repeats, in the lanes' own order."""
    names = {_known_lane(_valid_lane(lane)) for lane in lanes}
    if not names:
        raise ValueError(f"a member needs at least one lane (known: {', '.join(ALL_LANES)})")
    return tuple(lane for lane in ALL_LANES if lane in names)


def list_members(session: Session) -> list[Member]:
    """Every member by name; `member.active_prefixes` lists their unrevoked tokens, `allowed_lanes(member)` their lanes."""
    query = select(Member).options(selectinload(Member.tokens), selectinload(Member.settings)).order_by(Member.name)
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
    query = (select(Token).options(selectinload(Token.member).selectinload(Member.settings))
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
    if "/" in name:  # `<member>/<user>` is a proxy's user (`Caller.key`): a member so named would be one
        raise ValueError("member name must not contain '/' (a proxy's users are named <member>/<user>)")
    return name


def _valid_lane(lane: str | None) -> str | None:
    if lane is None:
        return None
    lane = lane.strip()
    if not lane or len(lane) > MAX_LANE_LEN:
        raise ValueError(f"a lane name has 1 to {MAX_LANE_LEN} characters")
    return lane


def _known_lane(lane: str) -> str:
    if lane not in ALL_LANES:
        raise ValueError(f"unknown lane {lane!r} (known: {', '.join(ALL_LANES)})")
    return lane


def _find(session: Session, name: str) -> Member | None:
    return session.scalar(select(Member).where(Member.name == name.strip()))


def _get(session: Session, name: str) -> Member:
    member = _find(session, name)
    if member is None:
        raise ValueError(f"no member named {name!r}")
    return member
