"""Clients that cannot send homeai's lane header, recognised by what they send.

Open WebUI (0.12) asks the model for its background tasks (a chat's title, its tags, follow-up
suggestions, search queries, autocompletion) with the same connection, member and lane as people's
chats, `stream: false`, and a prompt filled from one of its task templates (recorded, and made
from the package's own templates, in tests/fixtures/open_webui/). Such a request asked on the chat
lane goes to `[clients] background_task_lane` ("summaries" by default) when the member may use
that lane, so it queues behind the household's chats rather than ahead of them; otherwise it stays
where it was asked. Every protocol's chat passes here (`Service.chat`), so the rule is the same on
`/api/chat` and `/v1/chat/completions`.

Only those tasks move, recognised by their templates' opening (`TASKS`) and their chat history
block: Open WebUI's retrieval template opens "### Task:" too, and the answer it carries is one a
person waits for, so a prompt that merely opens "### Task:" stays on chat. A streamed answer stays
on chat whatever its prompt: someone reads it as it is written (Open WebUI asks every task with
`stream: false` and streams every answer to a user's message). A task template the
client's admin rewrote is not recognised: its Task model named with a lane (`<model>:summaries`,
`homeai.service.names`) moves it instead.

All of a tool's users come with one member's token. A member marked as a trusted proxy
(`homeai members add owui --proxy`) names the person asking in `[clients] proxy_user_header`
(Open WebUI's `X-OpenWebUI-User-Id`, sent with `ENABLE_FORWARD_USER_INFO_HEADERS=true`): each
such user is then a fair-share key of their own, `<member>/<user>` (`as_user`), within the
member's lanes and limits. From anyone else the header is ignored. A proxy's value that is not an
id (1-64 letters, digits and `._@+-`) is a 400 naming the header, never echoing the value:
merging the users silently would hide a misconfigured proxy.

A proxy's users share what the client wrote before any of them did (issue 54: Open WebUI's 36
tools, 6.6k tokens, read once for all of them; `homeai.sched.prefix`). What counts as the client's
is decided here (`client_preamble`): the tool definitions; its system messages before the first
user message only with `[clients] proxy_system_text_shared` (Open WebUI puts a user's own System
Prompt and Memory there); nothing when household documents a user's question chose open the prompt.
"""

from __future__ import annotations

import re
from dataclasses import replace

from homeai.engine.prompt import CLIENT_ROLES
from homeai.service.errors import ServiceError
from homeai.service.rights import Caller, allow_lane

TASK_OPENING = "### Task:"
HISTORY_TAG = "<chat_history>"  # every background task template quotes the chat in this block
# The first words after "### Task:" of Open WebUI 0.12's default background task templates
# (open_webui/config.py, DEFAULT_*_PROMPT_TEMPLATE), by task
TASKS = {
    "title": "Generate a concise title summarizing the chat history.",
    "tags": "Generate 1-3 broad tags categorizing the main themes of the chat history",
    "follow_ups": "Predict 3-5 useful messages this user might naturally send next",
    "queries": "Analyze the chat history to determine the necessity of generating search queries",
    "autocomplete": "You are an autocompletion system.",
}
CHAT_LANE = "chat"
MAX_USER_LEN = 64
USER_ID = re.compile(rf"[A-Za-z0-9._@+-]{{1,{MAX_USER_LEN}}}")


def as_user(caller: Caller, header: str, value: str | None) -> Caller:
    """`caller` asking for the user `value` (the `header`'s) when `caller` is a trusted proxy that
    named one; else `caller` as it is."""
    if not caller.proxy or not header or value is None:
        return caller
    if USER_ID.fullmatch(value) is None:
        raise ServiceError(400, f"the {header} header must name a user in 1 to {MAX_USER_LEN} letters, digits "
                                f"or . _ @ + - (this member is a proxy: it names who is asking)",
                           code="invalid_proxy_user", param=header)
    return replace(caller, user=value)


def client_preamble(cfg, messages: list[dict], *, documents: bool = False) -> bool:
    """Whether the prompt's tools and leading system messages count as the client's own text (shared
    by a trusted proxy's users: `template.Source.CLIENT`): not when `documents` open it, nor when a
    system message opens it unless `[clients] proxy_system_text_shared` says the client wrote it."""
    if documents:
        return False
    return cfg.clients.proxy_system_text_shared or not (messages and messages[0].get("role") in CLIENT_ROLES)


def task_lane(cfg, caller: Caller, lane: str, messages: list[dict], *, streamed: bool = False) -> str:
    """The lane to answer on: the background task lane for a task prompt asked on the chat lane
    without streaming."""
    target = cfg.clients.background_task_lane
    if not target or lane != CHAT_LANE or streamed or not is_background_task(messages):
        return lane
    try:
        allow_lane(caller, target)
    except ServiceError:
        return lane
    return target


def is_background_task(messages: list[dict]) -> bool:
    """A system message or the latest user turn is one of the client's background tasks (`task_of`)."""
    users = [m for m in messages if m.get("role") == "user"]
    asked = [m for m in messages if m.get("role") == "system"] + users[-1:]
    return any(task_of(_text(m.get("content"))) is not None for m in asked)


def task_of(text: str) -> str | None:
    """The background task (a `TASKS` key) whose template `text` was filled from, else None."""
    head = text.lstrip()
    if not head.startswith(TASK_OPENING) or HISTORY_TAG not in head:
        return None
    opening = head[len(TASK_OPENING):].lstrip()
    return next((task for task, words in TASKS.items() if opening.startswith(words)), None)


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's content parts: the first text part
        return next((p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"), "")
    return ""
