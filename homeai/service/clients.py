"""Clients that cannot send homeai's lane header, recognised by what they send.

Open WebUI (0.12) asks the model for its background tasks (a chat's title, its tags, follow-up
suggestions, ...) with the same connection, member and lane as people's chats, `stream: false`,
and a prompt that opens "### Task:" (its task templates; recorded in tests/fixtures/open_webui/).
Such a request asked on the chat lane goes to `[clients] background_task_lane` ("summaries" by
default) when the member may use that lane, so it queues behind the household's chats rather than
ahead of them; otherwise it stays where it was asked. Every protocol's chat passes here
(`Service.chat`), so the rule is the same on `/api/chat` and `/v1/chat/completions`.
"""

from __future__ import annotations

from homeai.service.errors import ServiceError
from homeai.service.rights import Caller, allow_lane

TASK_OPENING = "### Task:"
CHAT_LANE = "chat"


def task_lane(cfg, caller: Caller, lane: str, messages: list[dict]) -> str:
    """The lane to answer on: the background task lane for a task prompt asked on the chat lane."""
    target = cfg.clients.background_task_lane
    if not target or lane != CHAT_LANE or not is_background_task(messages):
        return lane
    try:
        allow_lane(caller, target)
    except ServiceError:
        return lane
    return target


def is_background_task(messages: list[dict]) -> bool:
    """A system message or the latest user turn opens with "### Task:"."""
    users = [m for m in messages if m.get("role") == "user"]
    asked = [m for m in messages if m.get("role") == "system"] + users[-1:]
    return any(_text(m.get("content")).lstrip().startswith(TASK_OPENING) for m in asked)


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's content parts: the first text part
        return next((p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"), "")
    return ""
