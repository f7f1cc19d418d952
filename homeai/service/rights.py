"""A member's rights: who is asking (`Caller`) and the lanes they may use.

Every protocol asks here before a lane is used (Wyoming too, for the member it acts as:
`member_may_use`): an unknown lane is a 400 `unknown_lane`, a lane
the member may not use a 403 `lane_not_allowed` naming the lanes they may
(`homeai.store.members.check_lane`). The default member is an admin: every lane.

A caller is shared fairly with the others by `Caller.key`: the member's name, or for a trusted
proxy's user `<member>/<user>` (`homeai.service.clients.as_user`); rights are the member's either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeai.service.errors import ServiceError
from homeai.store.members import LaneNotAllowed, check_lane, lanes_of
from lanes.base import LanePolicy


@dataclass(frozen=True)
class Caller:
    name: str
    is_admin: bool
    member_id: int  # the member's row: routes scope their queries by it
    lanes: tuple[str, ...]  # the lanes they may use
    default_lane: str | None = None  # where their requests go when they name no lane (None: the route's own)
    proxy: bool = False  # a trusted proxy: the user it names is shared fairly as a key of their own
    user: str | None = None  # that user (set only for a proxy, from `[clients] proxy_user_header`)

    @property
    def key(self) -> str:
        """Who the engine shares fairly by: the member, or a proxy's user within it."""
        return self.name if self.user is None else f"{self.name}/{self.user}"

    @property
    def group(self) -> str:
        """The trusted proxy whose users share its client's prompt prefix (`Request.group`): this
        member when it is one (from its proxy flag, never from a key's shape), else ""."""
        return self.name if self.proxy else ""


def lane_for(program, caller: Caller, name: str | None, default: str) -> tuple[str, LanePolicy]:
    """The lane a request asked for (`name`, else `default`) and its policy: a 400 when there is no
    such lane, a 403 when `caller` may not use it."""
    lane = name or default
    policy = program.cfg.lanes.get(lane)
    if policy is None:
        raise ServiceError(400, f"unknown lane {lane!r} (known: {', '.join(program.cfg.lanes)})",
                           code="unknown_lane", param="lane")
    allow_lane(caller, lane)
    return lane, policy


def allow_lane(caller: Caller, lane: str) -> None:
    """A 403 naming the lanes `caller` may use, unless `lane` is one."""
    try:
        check_lane(caller.name, caller.lanes, lane)
    except LaneNotAllowed as e:
        raise ServiceError(403, str(e), code="lane_not_allowed", param="lane") from None


def member_may_use(sessions, member: str, lane: str) -> None:
    """The member named `member` (Wyoming's `wyoming.member`) exists and may use `lane`, read from
    the store now (a change by `homeai members lanes` applies at once): else a 403 naming the lanes
    they may use, or a 404 `unknown_member`. Blocking: call it off the event loop."""
    try:
        with sessions() as session:
            check_lane(member, lanes_of(session, name=member), lane)
    except LaneNotAllowed as e:
        raise ServiceError(403, str(e), code="lane_not_allowed", param="lane") from None
    except ValueError as e:
        raise ServiceError(404, str(e), code="unknown_member") from None
