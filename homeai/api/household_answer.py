"""The household's answers in flight: the service's answer stream as household server-sent events,
stored in the conversation exactly once, however it ends.

`Inflight` keeps one answer per (member, conversation) and lets `/stop` and a deleted conversation
abort it. `AnswerEvents` formats the answer stream: the first events the route prepared
(`message.user`), `response.thinking` {text} for each piece of the model's thoughts (the page
shows them folded, apart from the answer), `response.delta` {text} for each piece of text, then
`response.done` {message, finish_reason: stop | length | abort, usage, replaces, thinking} or
`error` {error}. The text said so far is stored when the stream ends, when it is stopped, or when
the client leaves; the thoughts are not stored (the conversation keeps what was said).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from homeai.api.errors import ApiError
from homeai.service import Answer, Done, Failed, Text, Thinking
from homeai.store import conversations as convs
from homeai.store.models import Message
from homeai.wire import SSE_HEADERS, error_body, sse


@dataclass
class Reply:
    """One answer on its way to a conversation: the service's answer and what storing it needs."""

    answer: Answer
    member_id: int
    replaces: list[int] = field(default_factory=list)  # the answers a regenerated one replaces
    first_events: list[dict] = field(default_factory=list)


# ---- answers in flight ----------------------------------------------------------------


@dataclass
class Slot:
    answer: Answer | None = None  # None while the prompt is being prepared
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

    def attach(self, slot: Slot, answer: Answer) -> None:
        slot.answer = answer
        if slot.stop_requested:
            answer.abort()

    def release(self, key: tuple[str, int], slot: Slot) -> None:
        if self.slots.get(key) is slot:
            del self.slots[key]

    def stop(self, key: tuple[str, int]) -> bool:
        slot = self.slots.get(key)
        if slot is None:
            return False
        slot.stop_requested = True
        if slot.answer is not None:
            slot.answer.abort()
        return True


def get_inflight(request: Request) -> Inflight:
    state = request.app.state
    inflight = getattr(state, "household_inflight", None)
    if inflight is None:  # no await in between: nothing else on the loop can race this
        inflight = state.household_inflight = Inflight()
    return inflight


InflightDep = Annotated[Inflight, Depends(get_inflight)]


# ---- the stream -----------------------------------------------------------------------


class AnswerEvents:
    """The events of one answer, and storing it exactly once, however it ends."""

    def __init__(self, runtime, conversation_id: int, reply: Reply, release: Callable[[], None]):
        self.runtime, self.conversation_id, self.reply, self.release = runtime, conversation_id, reply, release
        self.parts: list[str] = []
        self.thoughts: list[str] = []
        self._lock = threading.Lock()
        self._saved = False
        self._message: dict | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        for event in self.reply.first_events:
            yield sse(event)
        answer, reason, failed = self.reply.answer, "stop", None
        async for event in answer:
            if isinstance(event, Text) and event.text:
                yield self._delta(event.text)
            elif isinstance(event, Thinking):
                self.thoughts.append(event.text)
                yield sse({"type": "response.thinking", "text": event.text})
            elif isinstance(event, Done):
                reason = event.reason
            elif isinstance(event, Failed):
                reason, failed = event.reason, event.error
        message = await asyncio.to_thread(self.save)
        if failed is not None and reason != "abort":
            yield sse({"type": "error", **error_body(failed.message, failed.type, failed.code)})
            return
        yield sse({"type": "response.done", "message": message, "finish_reason": reason,
                   "replaces": self.reply.replaces if message else [],
                   "usage": {"prompt_tokens": answer.num_prompt_tokens,
                             "completion_tokens": answer.num_output_tokens},
                   "thinking": "".join(self.thoughts)})

    def _delta(self, text: str) -> str:
        self.parts.append(text)
        return sse({"type": "response.delta", "text": text})

    def save(self) -> dict | None:
        """Store the answer (once: from the stream's end, or from `close` when the client left)."""
        with self._lock:
            if not self._saved:
                self._saved = True
                self._message = self._store("".join(self.parts))
            return self._message

    def close(self) -> None:
        self.release()
        if not self.reply.answer.finished:  # the client went away: free the sequence within one step
            self.reply.answer.abort()
        self.save()  # a no-op when stored already; a cancelled task cannot await, so a short sync write

    def _store(self, text: str) -> dict | None:
        """Store the answer, replacing the one regenerated; nothing when there is no text."""
        if not text:
            return None
        reply = self.reply
        with self.runtime.sessions() as session:
            for old in session.scalars(select(Message).where(Message.id.in_(reply.replaces),
                                                             Message.conversation_id == self.conversation_id)):
                session.delete(old)
            message = convs.add_message(session, member_id=reply.member_id, conversation_id=self.conversation_id,
                                        role="assistant", content=text,
                                        prompt_tokens=reply.answer.num_prompt_tokens,
                                        output_tokens=reply.answer.num_output_tokens)  # commits the deletes with it
            return message_json(message) if message is not None else None


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


def message_json(m: Message) -> dict:
    """A stored message, its images as where to fetch them (the household's image route)."""
    images = [{"url": f"/api/conversations/{m.conversation_id}/messages/{m.id}/images/{i.position}",
               "media_type": i.media_type} for i in m.images]
    return {"id": m.id, "role": m.role, "content": m.content, "created_at": m.created_at.isoformat(),
            "prompt_tokens": m.prompt_tokens, "output_tokens": m.output_tokens, "images": images}
