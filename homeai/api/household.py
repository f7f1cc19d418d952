"""The household chat: the calling member's conversations, and answers streamed into them.

    GET    /api/conversations                   {"data": [conversation, ...]}, newest first
    POST   /api/conversations {title?}          201 conversation
    GET    /api/conversations/{id}              conversation with "messages" (each with "images": [{url, media_type}])
    PATCH  /api/conversations/{id} {title}      conversation
    DELETE /api/conversations/{id}              204 (an answer in progress is aborted)
    POST   /api/conversations/{id}/messages {content, images?, max_tokens?, temperature?, lane?, think?}   event stream
    POST   /api/conversations/{id}/regenerate {max_tokens?, temperature?, lane?, think?}          event stream
    POST   /api/conversations/{id}/stop         {"stopped": bool}
    GET    /api/conversations/{id}/messages/{message_id}/images/{n}   the n-th image sent with a message (its file)

Every query is scoped by the caller: another member's conversation (or its images) is a 404, never a 403.
A message's `images` are data URLs (`data:image/png;base64,...`, at most `[limits] max_images`), each
read before anything is stored (a 400 naming `images.N`); the files are stored with the question, and
every answer in the conversation sees them (`homeai.api.household_images`: the latest that a request may
read), so a follow-up can ask about a picture sent earlier. A model without a vision projector refuses a
message with images (400); its answers leave earlier messages' images out.
An answer streams as server-sent events, `data: {json}` with a `type` (the voice socket's names):
`message.user` (the stored question, send only), `response.thinking` {text} (a thinking model's
thoughts, never stored), `response.delta` {text}, then `response.done` {message, finish_reason:
stop | length | abort, usage, replaces, thinking} or `error` {error}. The answer is stored when it
ends, however it ends: a stop keeps what was said so far. Closing the stream aborts the sequence,
and so does `/stop`; one answer per conversation at a time.
Answers are on the chat lane, or the body's `lane` (homeai's field, as on `/v1`): a lane the
member may not use is a 403 naming the lanes they may, one that does not exist a 400, one served
by a remote server a 400 (the household's answers are local: `/v1` forwards).
The routes ask the service for the answer (`service.chat`, the latest turns that fit);
`homeai.api.household_answer` formats its stream as these events and stores it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Path, Response
from pydantic import Field
from sqlalchemy.orm import Session

from homeai.api import household_images
from homeai.api.auth import Caller, CurrentMember
from homeai.api.deps import RuntimeDep, ServiceDep
from homeai.api.errors import ApiError
from homeai.api.household_answer import AnswerEvents, AnswerResponse, Inflight, InflightDep, Reply, message_json
from homeai.api.household_images import Turn
from homeai.api.schemas import RequestBody
from homeai.service import ChatAsk, ImageIn, SamplingAsk, ThinkAsk
from homeai.store import conversations as convs
from homeai.store.models import Conversation, Message

# A database id: larger values would overflow SQLite's integer and fail as a 500.
ConversationId = Annotated[int, Path(ge=1, le=2**63 - 1)]
MessageId = Annotated[int, Path(ge=1, le=2**63 - 1)]
ImageNumber = Annotated[int, Path(ge=0, le=2**31 - 1)]

router = APIRouter(prefix="/api/conversations", tags=["household"])

LANE = "chat"
DEFAULT_TITLE = "New conversation"
MAX_CONTENT_CHARS = 100_000


class NewConversation(RequestBody):
    title: str | None = Field(None, max_length=convs.MAX_TITLE_LEN)


class Rename(RequestBody):
    title: str = Field(min_length=1, max_length=convs.MAX_TITLE_LEN)


class Generate(RequestBody):
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    lane: str | None = None  # homeai's, as on /v1: a lane the member may use (default: chat)
    think: bool | None = None  # a model that can think: whether it should (None: its template's default)

    def ask(self, history: list[dict], images: tuple[ImageIn, ...], lane: str) -> ChatAsk:
        """The lane's answer to `history`, whose marks name `images`: the latest turns that fit (the
        lane's answer length by default)."""
        sampling = SamplingAsk(max_tokens=self.max_tokens, temperature=self.temperature)
        return ChatAsk(messages=history, lane=lane, sampling=sampling, fit="latest", prompt_param="content",
                       think=ThinkAsk(on=self.think), images=images)


class Send(Generate):
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    images: list[str] = Field(default_factory=list)  # data URLs, read before anything is stored


# ---- conversations --------------------------------------------------------------------


@router.get("")
def list_conversations(runtime: RuntimeDep, member: CurrentMember) -> dict:
    with runtime.sessions() as session:
        rows = convs.list_conversations(session, member_id=member.member_id)
        return {"data": [_conversation(c) for c in rows]}


@router.post("", status_code=201)
def create_conversation(body: NewConversation, runtime: RuntimeDep, member: CurrentMember) -> dict:
    with runtime.sessions() as session:
        conversation = convs.create_conversation(session, member_id=member.member_id,
                                                 title=body.title or DEFAULT_TITLE)
        return _conversation(conversation)


@router.get("/{conversation_id}")
def get_conversation(conversation_id: ConversationId, runtime: RuntimeDep, member: CurrentMember) -> dict:
    with runtime.sessions() as session:
        conversation = _owned(session, member, conversation_id)
        return {**_conversation(conversation), "messages": [message_json(m) for m in conversation.messages]}


@router.patch("/{conversation_id}")
def rename_conversation(conversation_id: ConversationId, body: Rename, runtime: RuntimeDep, member: CurrentMember) -> dict:
    with runtime.sessions() as session:
        conversation = convs.rename_conversation(session, member_id=member.member_id,
                                                 conversation_id=conversation_id, title=body.title)
        if conversation is None:
            raise _not_found(conversation_id)
        return _conversation(conversation)


@router.delete("/{conversation_id}", status_code=204)
async def delete_conversation(conversation_id: ConversationId, runtime: RuntimeDep, member: CurrentMember,
                              inflight: InflightDep) -> Response:
    deleted = await asyncio.to_thread(_delete, runtime, member, conversation_id)
    if not deleted:
        raise _not_found(conversation_id)
    inflight.stop((member.name, conversation_id))
    return Response(status_code=204)


def _delete(runtime, member: Caller, conversation_id: int) -> bool:
    with runtime.sessions() as session:
        return convs.delete_conversation(session, member_id=member.member_id,
                                         conversation_id=conversation_id)


# ---- answers --------------------------------------------------------------------------


@router.post("/{conversation_id}/messages")
async def send_message(conversation_id: ConversationId, body: Send, runtime: RuntimeDep, service: ServiceDep,
                       member: CurrentMember, inflight: InflightDep) -> AnswerResponse:
    lane = _lane(service, member, body.lane)
    service.check_limits(max_tokens=body.max_tokens)

    async def prepare() -> Reply:
        files = await asyncio.to_thread(household_images.read, body.images, service.cfg.limits)
        turns, is_first = await asyncio.to_thread(_question, runtime, member, conversation_id, body.content,
                                                  tuple(data for _, data in files))
        answer = await service.chat(body.ask(*_prompt(service, turns), lane), member)
        try:
            stored = await asyncio.to_thread(_store_question, runtime, member, conversation_id, body.content,
                                             files, answer.num_prompt_tokens, is_first)
        except BaseException:
            answer.abort()
            raise
        return Reply(answer, member.member_id, first_events=[{"type": "message.user", "message": stored}])

    return await _answer(runtime, service, inflight, member, conversation_id, prepare)


@router.post("/{conversation_id}/regenerate")
async def regenerate(conversation_id: ConversationId, runtime: RuntimeDep, service: ServiceDep,
                     member: CurrentMember, inflight: InflightDep, body: Generate | None = None) -> AnswerResponse:
    body = body or Generate()
    lane = _lane(service, member, body.lane)
    service.check_limits(max_tokens=body.max_tokens)

    async def prepare() -> Reply:
        turns, replaces = await asyncio.to_thread(_again, runtime, member, conversation_id)
        answer = await service.chat(body.ask(*_prompt(service, turns), lane), member)
        return Reply(answer, member.member_id, replaces=replaces)

    return await _answer(runtime, service, inflight, member, conversation_id, prepare)


@router.post("/{conversation_id}/stop")
def stop(conversation_id: ConversationId, runtime: RuntimeDep, member: CurrentMember, inflight: InflightDep) -> dict:
    """Abort the answer in progress; its stream ends with `response.done`, finish_reason "abort"."""
    if inflight.stop((member.name, conversation_id)):
        return {"stopped": True}
    with runtime.sessions() as session:
        _owned(session, member, conversation_id)
    return {"stopped": False}


@router.get("/{conversation_id}/messages/{message_id}/images/{n}")
def message_image(conversation_id: ConversationId, message_id: MessageId, n: ImageNumber, runtime: RuntimeDep,
                  member: CurrentMember) -> Response:
    """The file of the n-th image sent with a message, as it came (private: the member's own)."""
    with runtime.sessions() as session:
        image = convs.get_image(session, member_id=member.member_id, conversation_id=conversation_id,
                                message_id=message_id, position=n)
        if image is None:
            raise ApiError(404, f"no image {n} in message {message_id} of conversation {conversation_id}",
                           code="image_not_found")
        return Response(image.data, media_type=image.media_type,
                        headers={"Cache-Control": "private", "X-Content-Type-Options": "nosniff"})


async def _answer(runtime, service, inflight: Inflight, member: Caller, conversation_id: int,
                  prepare: Callable[[], Awaitable[Reply]]) -> AnswerResponse:
    """Claim the conversation's one answer, prepare it, and stream it as household events."""
    key = (member.name, conversation_id)
    slot = inflight.claim(key)
    try:
        reply = await prepare()
    except BaseException:
        inflight.release(key, slot)
        raise
    inflight.attach(slot, reply.answer)
    return AnswerResponse(AnswerEvents(runtime, conversation_id, reply, lambda: inflight.release(key, slot)))


def _lane(service, member: Caller, asked: str | None) -> str:
    """The lane asked for (default chat) when the member may use it: 400 unknown, 403 not theirs, as on /v1;
    400 for a lane a remote server answers."""
    lane = service.lane(member, asked, LANE)[0]
    if service.remotes.get(lane) is not None:
        raise ApiError(400, f"lane {lane!r} is served by a remote server; use the OpenAI API (/v1) for it",
                       code="remote_lane", param="lane")
    return lane


def _question(runtime, member: Caller, conversation_id: int, content: str,
              files: tuple[bytes, ...]) -> tuple[list[Turn], bool]:
    """The conversation's turns with the new question (and its images' files), and whether it is the
    first (it names the conversation)."""
    with runtime.sessions() as session:
        conversation = _owned(session, member, conversation_id)
        turns = [*_turns(runtime, session, conversation.messages), Turn("user", content, files)]
        return turns, not conversation.messages and conversation.title == DEFAULT_TITLE


def _store_question(runtime, member: Caller, conversation_id: int, content: str, files: list[tuple[str, bytes]],
                    num_prompt_tokens: int, is_first: bool) -> dict:
    kwargs = dict(member_id=member.member_id, conversation_id=conversation_id)
    with runtime.sessions() as session:
        stored = convs.add_message(session, **kwargs, role="user", content=content, prompt_tokens=num_prompt_tokens,
                                   images=files)
        if stored is None:
            raise _not_found(conversation_id)
        if is_first:
            convs.rename_conversation(session, **kwargs, title=content)
        return message_json(stored)


def _again(runtime, member: Caller, conversation_id: int) -> tuple[list[Turn], list[int]]:
    """The turns up to the last question, and the answers after it that a new one replaces."""
    with runtime.sessions() as session:
        messages = list(_owned(session, member, conversation_id).messages)
        replaces = []
        while messages and messages[-1].role == "assistant":
            replaces.append(messages.pop().id)
        if not messages or messages[-1].role != "user":
            raise ApiError(400, "there is no question to answer again in this conversation",
                           code="nothing_to_regenerate")
        return _turns(runtime, session, messages), replaces


# ---- store helpers --------------------------------------------------------------------


def _owned(session: Session, member: Caller, conversation_id: int) -> Conversation:
    conversation = convs.get_conversation(session, member_id=member.member_id,
                                          conversation_id=conversation_id)
    if conversation is None:
        raise _not_found(conversation_id)
    return conversation


def _not_found(conversation_id: int) -> ApiError:
    return ApiError(404, f"no conversation {conversation_id}", code="conversation_not_found")


def _turns(runtime, session: Session, messages: list[Message]) -> list[Turn]:
    """The messages with their images' files (the latest a request may read: the others are left out)."""
    files = convs.image_files(session, messages, latest=runtime.cfg.limits.max_images)
    return [Turn(m.role, m.content, tuple(files.get(m.id, ())), f"messages.{m.id}.images") for m in messages]


def _prompt(service, turns: list[Turn]) -> tuple[list[dict], tuple[ImageIn, ...]]:
    """The messages and their images (earlier messages' only for a model that reads images)."""
    stored = any(t.files for t in turns[:-1]) and service.sees()
    return household_images.prompt(turns, service.cfg.limits, stored=stored)


def _conversation(c: Conversation) -> dict:
    return {"id": c.id, "title": c.title, "created_at": c.created_at.isoformat(),
            "updated_at": c.updated_at.isoformat()}
