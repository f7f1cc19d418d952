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
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from homeai.api.auth import Caller, CurrentMember, allow_lane
from homeai.api.deps import EngineDep, RuntimeDep
from homeai.api.errors import ApiError, error_body
from homeai.api.limits import check_generation
from homeai.api.schemas import RequestBody
from homeai.api.streaming import SSE_HEADERS, sse
from homeai.api.submit import off_loop
from homeai.engine.engine import Engine, PromptTooLong, RequestStream, TokenEvent
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


# ---- answers in flight ----------------------------------------------------------------


@dataclass
class Slot:
    stream: RequestStream | None = None  # None while the prompt is being prepared
    stop_requested: bool = False


@dataclass
class Inflight:
    """The answer being generated per (member, conversation); touched only on the event loop."""

    slots: dict[tuple[str, int], Slot] = field(default_factory=dict)

    def claim(self, key: tuple[str, int]) -> Slot:
        if key in self.slots:
            raise ApiError(409, "an answer is already being generated in this conversation; stop it first",
                           code="answer_in_progress")
        slot = self.slots[key] = Slot()
        return slot

    def attach(self, slot: Slot, stream: RequestStream) -> None:
        slot.stream = stream
        if slot.stop_requested:
            stream.abort()

    def release(self, key: tuple[str, int], slot: Slot) -> None:
        if self.slots.get(key) is slot:
            del self.slots[key]

    def stop(self, key: tuple[str, int]) -> bool:
        slot = self.slots.get(key)
        if slot is None:
            return False
        slot.stop_requested = True
        if slot.stream is not None:
            slot.stream.abort()
        return True


def get_inflight(request: Request) -> Inflight:
    state = request.app.state
    inflight = getattr(state, "household_inflight", None)
    if inflight is None:  # no await in between: nothing else on the loop can race this
        inflight = state.household_inflight = Inflight()
    return inflight


InflightDep = Annotated[Inflight, Depends(get_inflight)]


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
        return {**_conversation(conversation), "messages": [_message(m) for m in conversation.messages]}


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

    def prepare(loop) -> Answer:
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
                answer.first_events.append({"type": "message.user", "message": _message(stored)})
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

    def prepare(loop) -> Answer:
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


@dataclass
class Answer:
    """One answer on its way: the engine's stream and what storing it needs."""

    stream: RequestStream
    num_prompt_tokens: int
    member_id: int = 0
    replaces: list[int] = field(default_factory=list)
    first_events: list[dict] = field(default_factory=list)

    def abort(self) -> None:
        self.stream.abort()


async def _answer(runtime, engine: Engine, inflight: Inflight, member: Caller, conversation_id: int,
                  prepare: Callable[[asyncio.AbstractEventLoop], Answer]) -> StreamingResponse:
    allow_lane(member, LANE)  # a member who may not use the chat lane gets a 403 naming theirs
    key = (member.name, conversation_id)
    slot = inflight.claim(key)
    loop = asyncio.get_running_loop()
    try:
        answer = await off_loop(lambda: prepare(loop), engine=engine, lane=LANE, prompt_param="content")
    except BaseException:
        inflight.release(key, slot)
        raise
    inflight.attach(slot, answer.stream)
    return AnswerResponse(AnswerEvents(runtime, conversation_id, answer, lambda: inflight.release(key, slot)))


class AnswerEvents:
    """The events of one answer, and storing it exactly once, however it ends."""

    def __init__(self, runtime, conversation_id: int, answer: Answer, release: Callable[[], None]):
        self.runtime, self.conversation_id, self.answer, self.release = runtime, conversation_id, answer, release
        self.parts: list[str] = []
        self.num_tokens = 0
        self._lock = threading.Lock()
        self._saved = False
        self._message: dict | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        answer, stream = self.answer, self.answer.stream
        for event in answer.first_events:
            yield sse(event)
        async for event in stream:
            if isinstance(event, TokenEvent):
                self.num_tokens += 1
                if event.text:
                    yield self._delta(event.text)
        finish = stream.finished
        if finish.text:
            yield self._delta(finish.text)
        message = await asyncio.to_thread(self.save)
        if finish.reason == "error":
            yield sse({"type": "error", **error_body(f"generation failed: {finish.error}", "server_error",
                                                      "generation_failed")})
            return
        yield sse({"type": "response.done", "message": message, "finish_reason": finish.reason,
                   "replaces": answer.replaces if message else [],
                   "usage": {"prompt_tokens": answer.num_prompt_tokens, "completion_tokens": self.num_tokens}})

    def _delta(self, text: str) -> str:
        self.parts.append(text)
        return sse({"type": "response.delta", "text": text})

    def save(self) -> dict | None:
        """Store the answer (once: from the stream's end, or from `close` when the client left)."""
        with self._lock:
            if not self._saved:
                self._saved = True
                self._message = _store_answer(self.runtime, self.conversation_id, self.answer,
                                              "".join(self.parts), self.num_tokens)
            return self._message

    def close(self) -> None:
        self.release()
        if self.answer.stream.finished is None:  # the client went away: free the sequence within one step
            self.answer.stream.abort()
        self.save()  # a no-op when stored already; a cancelled task cannot await, so a short sync write


class AnswerResponse(StreamingResponse):
    """A stream of answer events that cleans up when the response ends, however it ends: when
    the client leaves while a chunk is being sent, Starlette never closes the generator."""

    def __init__(self, events: AnswerEvents):
        super().__init__(aiter(events), media_type="text/event-stream", headers=SSE_HEADERS)
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.events.close()


def _store_answer(runtime, conversation_id: int, answer: Answer, text: str, num_tokens: int) -> dict | None:
    """Store the answer, replacing the one regenerated; nothing when there is no text."""
    if not text:
        return None
    with runtime.sessions() as session:
        for old in session.scalars(select(Message).where(Message.id.in_(answer.replaces),
                                                         Message.conversation_id == conversation_id)):
            session.delete(old)
        message = convs.add_message(session, member_id=answer.member_id, conversation_id=conversation_id,
                                    role="assistant", content=text, prompt_tokens=answer.num_prompt_tokens,
                                    output_tokens=num_tokens)  # commits the deletes with it
        return _message(message) if message is not None else None


def _submit(engine: Engine, member: Caller, history: list[dict], params: SamplingParams, loop) -> Answer:
    """Queue the latest turns that fit (the chat lane leaves room for the answer) on the chat lane."""
    runner = engine.runner
    limit = chat_lane.prompt_limit(engine.max_seq_len_for(LANE), params.max_tokens)
    try:
        tokens = chat_lane.build_prompt(history, "", limit, template=runner.apply_chat_template,
                                        tokenize=runner.tokenize)
    except chat_lane.TooLong as e:  # the engine's refusal, so every route reports it alike
        raise PromptTooLong(e.num_tokens, e.limit) from None
    stream = engine.submit(tokens, lane=LANE, member=member.name, params=params, loop=loop)  # refusals: off_loop
    return Answer(stream, len(tokens))


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


def _message(m: Message) -> dict:
    return {"id": m.id, "role": m.role, "content": m.content, "created_at": m.created_at.isoformat(),
            "prompt_tokens": m.prompt_tokens, "output_tokens": m.output_tokens}
