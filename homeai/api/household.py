"""The household chat: the calling member's conversations, and answers streamed into them.

    GET    /api/conversations                   {"data": [conversation, ...]}, newest first
    POST   /api/conversations {title?}          201 conversation
    GET    /api/conversations/{id}              conversation with "messages"
    PATCH  /api/conversations/{id} {title}      conversation
    DELETE /api/conversations/{id}              204 (an answer in progress is aborted)
    POST   /api/conversations/{id}/messages {content, max_tokens?, temperature?}   event stream
    POST   /api/conversations/{id}/regenerate {max_tokens?, temperature?}          event stream
    POST   /api/conversations/{id}/stop         {"stopped": bool}

Every query is scoped by the caller: another member's conversation is a 404, never a 403.
An answer streams as server-sent events, `data: {json}` with a `type` (the voice socket's names):
`message.user` (the stored question, send only), `response.delta` {text}, then `response.done`
{message, finish_reason: stop | length | abort, usage, replaces} or `error` {error}. The answer
is stored when it ends, however it ends: a stop keeps what was said so far. Closing the
stream aborts the sequence, and so does `/stop`; one answer per conversation at a time.
Answers are on the chat lane: a member who may not use it gets a 403 naming the lanes they may.
`homeai.api.household_answer` formats an answer's stream as these events and stores it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import StreamingResponse
from pydantic import Field
from sqlalchemy.orm import Session

from homeai.api.auth import Caller, CurrentMember, allow_lane
from homeai.api.deps import EngineDep, RuntimeDep
from homeai.api.errors import ApiError
from homeai.api.household_answer import AnswerEvents, AnswerResponse, Inflight, InflightDep, Reply, message_json
from homeai.api.limits import check_generation
from homeai.api.schemas import RequestBody
from homeai.api.submit import off_loop
from homeai.engine.engine import Engine, PromptTooLong
from homeai.sched.request import SamplingParams
from homeai.store import conversations as convs
from homeai.store.models import Conversation, Message
from lanes import chat as chat_lane

# A database id: larger values would overflow SQLite's integer and fail as a 500.
ConversationId = Annotated[int, Path(ge=1, le=2**63 - 1)]

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

    def params(self, engine: Engine) -> SamplingParams:
        default = SamplingParams()
        max_tokens = self.max_tokens or engine.policies[LANE].max_tokens or default.max_tokens
        temperature = default.temperature if self.temperature is None else self.temperature
        return SamplingParams(temperature=temperature, max_tokens=max_tokens)


class Send(Generate):
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)


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
async def send_message(conversation_id: ConversationId, body: Send, runtime: RuntimeDep, engine: EngineDep,
                       member: CurrentMember, inflight: InflightDep) -> StreamingResponse:
    check_generation(runtime.cfg.server, max_tokens=body.max_tokens)

    def prepare(loop) -> Reply:
        member_id = member.member_id
        with runtime.sessions() as session:
            conversation = _owned(session, member, conversation_id)
            history = [*_turns(conversation.messages), {"role": "user", "content": body.content}]
            is_first = not conversation.messages and conversation.title == DEFAULT_TITLE
        answer = _submit(engine, member, history, body.params(engine), loop)
        try:
            with runtime.sessions() as session:
                stored = convs.add_message(session, member_id=member_id, conversation_id=conversation_id,
                                           role="user", content=body.content,
                                           prompt_tokens=answer.num_prompt_tokens)
                if stored is None:
                    raise _not_found(conversation_id)
                if is_first:
                    convs.rename_conversation(session, member_id=member_id, conversation_id=conversation_id,
                                              title=body.content)
                answer.first_events.append({"type": "message.user", "message": message_json(stored)})
        except BaseException:
            answer.stream.abort()
            raise
        answer.member_id = member_id
        return answer

    return await _answer(runtime, engine, inflight, member, conversation_id, prepare)


@router.post("/{conversation_id}/regenerate")
async def regenerate(conversation_id: ConversationId, runtime: RuntimeDep, engine: EngineDep, member: CurrentMember,
                     inflight: InflightDep, body: Generate | None = None) -> StreamingResponse:
    body = body or Generate()
    check_generation(runtime.cfg.server, max_tokens=body.max_tokens)

    def prepare(loop) -> Reply:
        member_id = member.member_id
        with runtime.sessions() as session:
            messages = list(_owned(session, member, conversation_id).messages)
        replaces = []
        while messages and messages[-1].role == "assistant":
            replaces.append(messages.pop().id)
        if not messages or messages[-1].role != "user":
            raise ApiError(400, "there is no question to answer again in this conversation",
                           code="nothing_to_regenerate")
        answer = _submit(engine, member, _turns(messages), body.params(engine), loop)
        answer.member_id, answer.replaces = member_id, replaces
        return answer

    return await _answer(runtime, engine, inflight, member, conversation_id, prepare)


@router.post("/{conversation_id}/stop")
def stop(conversation_id: ConversationId, runtime: RuntimeDep, member: CurrentMember, inflight: InflightDep) -> dict:
    """Abort the answer in progress; its stream ends with `response.done`, finish_reason "abort"."""
    if inflight.stop((member.name, conversation_id)):
        return {"stopped": True}
    with runtime.sessions() as session:
        _owned(session, member, conversation_id)
    return {"stopped": False}


async def _answer(runtime, engine: Engine, inflight: Inflight, member: Caller, conversation_id: int,
                  prepare: Callable[[asyncio.AbstractEventLoop], Reply]) -> StreamingResponse:
    allow_lane(member, LANE)  # a member who may not use the chat lane gets a 403 naming theirs
    key = (member.name, conversation_id)
    slot = inflight.claim(key)
    loop = asyncio.get_running_loop()
    try:
        reply = await off_loop(lambda: prepare(loop), engine=engine, lane=LANE, prompt_param="content")
    except BaseException:
        inflight.release(key, slot)
        raise
    inflight.attach(slot, reply.stream)
    return AnswerResponse(AnswerEvents(runtime, conversation_id, reply, lambda: inflight.release(key, slot)))


def _submit(engine: Engine, member: Caller, history: list[dict], params: SamplingParams, loop) -> Reply:
    """Queue the latest turns that fit (the chat lane leaves room for the answer) on the chat lane."""
    runner = engine.runner
    limit = chat_lane.prompt_limit(engine.max_seq_len_for(LANE), params.max_tokens)
    try:
        tokens = chat_lane.build_prompt(history, "", limit, template=runner.apply_chat_template,
                                        tokenize=runner.tokenize)
    except chat_lane.TooLong as e:  # the engine's refusal, so every route reports it alike
        raise PromptTooLong(e.num_tokens, e.limit) from None
    stream = engine.submit(tokens, lane=LANE, member=member.name, params=params, loop=loop)  # refusals: off_loop
    return Reply(stream, len(tokens))


# ---- store helpers --------------------------------------------------------------------


def _owned(session: Session, member: Caller, conversation_id: int) -> Conversation:
    conversation = convs.get_conversation(session, member_id=member.member_id,
                                          conversation_id=conversation_id)
    if conversation is None:
        raise _not_found(conversation_id)
    return conversation


def _not_found(conversation_id: int) -> ApiError:
    return ApiError(404, f"no conversation {conversation_id}", code="conversation_not_found")


def _turns(messages: list[Message]) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in messages]


def _conversation(c: Conversation) -> dict:
    return {"id": c.id, "title": c.title, "created_at": c.created_at.isoformat(),
            "updated_at": c.updated_at.isoformat()}


