"""One voice turn: an utterance transcribed, answered on the voice lane, the exchange stored.

The turn formats the service's answer stream as the voice socket's events: `transcript.final`,
`response.delta` for each piece of text (a thinking model's thoughts are neither sent nor spoken),
`response.tool_calls` for each call as soon as it is written whole, then `response.done` {text,
finish_reason, timings} or `error` {code, message}.
While the answer is tool calls, it waits for the client's `tool.result` of each and answers again
with them (`MAX_TOOL_ROUNDS`, the last in words). Speech is the service's one speech turn; the
answer is `service.chat` (the spoken-style system prompt and the last turns of the conversation
named, the latest that fit). In a session that speaks, the answer's text is also spoken
(`homeai.api.voice_audio`: its audio events come between `transcript.final` and the last event).
A cancelled turn (new speech, `response.cancel`) aborts its answer, which the engine frees within
one step, and stops its synthesis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from homeai.api.voice_audio import SpokenAnswer
from homeai.api.voice_protocol import Settings, VoiceError
from homeai.api import household_images
from homeai.engine.prompt import image_mark
from homeai.service import ChatAsk, ImageIn, SamplingAsk, ServiceError, ThinkAsk
from homeai.service.answer import Call, Done, Failed, Text
from homeai.store import conversations as convs
from lanes import voice as voice_lane
from lanes.base import LanePolicy

log = logging.getLogger("homeai.voice")

LANE = "voice"
MAX_TOOL_ROUNDS = 4  # calls and results in one turn before the answer must be in words
TOOL_RESULT_TIMEOUT_S = 60.0  # a client that never answers a call ends its turn with an error


def check_conversation(runtime, caller, conversation_id: int | None) -> None:
    """A conversation named at `session.start` must be the member's (blocking: the store)."""
    if conversation_id is None:
        return
    with runtime.sessions() as session:
        found = convs.get_conversation(session, member_id=caller.member_id, conversation_id=conversation_id)
    if found is None:
        raise VoiceError("conversation_not_found", f"no conversation {conversation_id} of yours")


def answer_sampling(policy: LanePolicy) -> SamplingAsk:
    """The sampling of a spoken answer: the voice lane's cap (160 tokens unless the household set
    another; a cut ends between words: `homeai.service.words`). Tests replace it to make answers long."""
    return SamplingAsk()


class Turn:
    """One utterance: transcribe it, answer it on the voice lane, store the exchange. `session` is
    the socket's `homeai.api.voice.VoiceSession`: who is asking, and `send` for the events."""

    def __init__(self, session, pcm: bytes, settings: Settings, ended_at: float, images: tuple[str, ...] = ()):
        self.session, self.pcm, self.settings, self.ended_at = session, pcm, settings, ended_at
        self.images = images  # data URLs the utterance asks about (`input_image`), before its words
        self.service, self.caller = session.service, session.caller
        self.transcript: str | None = None
        self.parts: list[str] = []
        self.stt_ms: float | None = None
        self.ttft_ms: float | None = None
        self.answer = None  # the service's Answer being streamed
        self.done: Done | None = None
        self.closed = False  # the last event (response.done or error) is being sent
        self.waiting_for: dict[str, str] = {}  # the calls sent to the client, awaiting results: id -> name
        self.results: asyncio.Queue = asyncio.Queue()
        self.audio: SpokenAnswer | None = None  # the answer spoken, when the session speaks

    async def run(self) -> None:
        try:
            await self._answer(await self._transcribe())
        except (VoiceError, ServiceError) as e:
            await self._fail(e.code, e.message)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("voice turn failed")
            await self._fail("internal_error", "the answer failed (see the server log)")
        finally:
            if self.answer is not None:
                self.answer.abort()  # a no-op once it has ended
            if self.audio is not None:
                await self.audio.stop()  # cancelled: no frame after this

    async def _transcribe(self) -> str:
        s = self.settings
        transcript = await self.session.hearing.transcribe(self.pcm, s.sample_rate, s.language, s.vad, need_words=True)
        self.stt_ms = self._ms()
        self.transcript = transcript.text
        await self.session.send({"type": "transcript.final", "text": transcript.text,
                                 "language": transcript.language, "duration_s": transcript.duration_s})
        return transcript.text

    async def _answer(self, question: str) -> None:
        """Answer, and while the answer is tool calls, send them and answer again with their results."""
        _, policy = self.service.lane(self.caller, LANE, LANE)
        history = await asyncio.to_thread(self._history)
        messages = voice_lane.build_messages(question, history)
        if self.images:  # the pictures go before the spoken question, as Ollama places them
            marks = "".join(image_mark(i) + "\n" for i in range(len(self.images)))
            messages = [*messages[:-1], {**messages[-1], "content": marks + messages[-1]["content"]}]
        pictures = tuple(ImageIn(url, f"input_image.{i}", url=True) for i, url in enumerate(self.images))
        if self.session.voice is not None:
            self.audio = SpokenAnswer(self.session, self.session.speaking, self.session.voice, LANE, self.ended_at)
            await self.audio.begin()
        for round_ in range(MAX_TOOL_ROUNDS):
            # The session's choice holds for the first answer; after results the model may answer in
            # words, and on the last round it must.
            choice = self.settings.tool_choice if round_ == 0 else "none" if round_ == MAX_TOOL_ROUNDS - 1 else "auto"
            # A spoken answer does not wait on thoughts: a model that can stop thinking is asked to;
            # one that cannot (gpt-oss) thinks, and its thoughts are neither sent nor said.
            ask = ChatAsk(messages=messages, lane=LANE, tools=self.settings.tools, tool_choice=choice,
                          sampling=answer_sampling(policy), fit="latest", prompt_param="messages",
                          think=ThinkAsk(on=False), images=pictures)
            self.answer = await self.service.chat(ask, self.caller)
            self.done = await self._stream_answer()
            if not self.done.calls:
                break
            messages = [*messages, *await self._call_tools(self.done.calls)]
        if self.audio is not None:
            await self.audio.finish()
        await self.finish(self.done.reason)

    async def _stream_answer(self) -> Done:
        """Send the answer's words as they come and each call as soon as it is written whole."""
        async for event in self.answer:
            if isinstance(event, (Text, Call)) and self.ttft_ms is None:
                self.ttft_ms = self._ms()  # the first text or call shown (with tools, text is held until decided)
            if isinstance(event, Text):
                await self._delta(event.text)
            elif isinstance(event, Call):
                await self._send_call(event.call)
            elif isinstance(event, Failed):
                if event.reason == "abort":
                    raise VoiceError("aborted", "the answer was aborted (the server is stopping)")
                raise VoiceError(event.error.code, event.error.message)
            elif isinstance(event, Done):  # its calls were each sent as a Call
                return event
        raise RuntimeError("an answer ended without Done or Failed")

    async def _send_call(self, call) -> None:
        """Send a call the client may run now (its result is awaited once the answer ends)."""
        self.waiting_for[call.id] = call.name
        await self.session.send({"type": "response.tool_calls",
                                 "tool_calls": [{"id": call.id, "name": call.name, "arguments": call.arguments}]})

    async def _call_tools(self, calls) -> list[dict]:
        """Wait for a `tool.result` of each call sent; the messages the next answer follows."""
        results = {}
        try:
            while self.waiting_for:
                call_id, content = await asyncio.wait_for(self.results.get(), TOOL_RESULT_TIMEOUT_S)
                results[call_id] = content
                self.waiting_for.pop(call_id, None)
        except asyncio.TimeoutError:
            raise VoiceError("tool_result_timeout", f"no tool.result within {TOOL_RESULT_TIMEOUT_S:g} s") from None
        finally:
            self.waiting_for = {}
        assistant = {"role": "assistant", "content": "", "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in calls]}
        return [assistant, *({"role": "tool", "tool_call_id": c.id, "name": c.name, "content": results[c.id]}
                             for c in calls)]

    def tool_result(self, message: dict) -> None:
        """A `tool.result` from the client: `tool_call_id` (optional while one call waits) and `content`."""
        call_id = message.get("tool_call_id")
        if call_id is None and len(self.waiting_for) == 1:
            call_id = next(iter(self.waiting_for))
        if call_id not in self.waiting_for:
            raise VoiceError("invalid_value", f"tool_call_id must name a call waiting for its result "
                             f"({', '.join(self.waiting_for)}), got {call_id!r}")
        content = message.get("content", "")
        self.results.put_nowait((call_id, content if isinstance(content, str) else
                                 json.dumps(content, ensure_ascii=False)))

    async def _delta(self, text: str) -> None:
        if not text:
            return
        self.parts.append(text)
        if self.audio is not None:
            self.audio.say(text)
        await self.session.send({"type": "response.delta", "text": text})

    async def finish(self, reason: str) -> None:
        """Send `response.done` and store the exchange (stop, length, cancelled or interrupted)."""
        self.closed = True
        text = "".join(self.parts)
        timings = {"stt_ms": self.stt_ms, "ttft_ms": self.ttft_ms}
        if self.session.voice is not None:  # the session speaks
            if self.audio is not None:
                await self.audio.close()
            timings["first_audio_ms"] = self.audio.first_audio_ms if self.audio is not None else None
        await self.session.send({"type": "response.done", "text": text, "finish_reason": reason,
                                 "timings": {**timings, "total_ms": self._ms()}})
        if self.transcript and self.settings.conversation_id is not None:
            await asyncio.to_thread(self._store, text)

    async def _fail(self, code: str, message: str) -> None:
        self.closed = True
        if self.audio is not None:
            await self.audio.close()
        await self.session.send({"type": "error", "code": code, "message": message})

    def _ms(self) -> float:
        return round((time.perf_counter() - self.ended_at) * 1000.0, 1)

    def _history(self) -> list[dict]:
        """The turns of the conversation named, if any, that the voice lane answers after."""
        conversation_id = self.settings.conversation_id
        if conversation_id is None:
            return []
        with self.session.runtime.sessions() as session:
            conversation = convs.get_conversation(session, member_id=self.caller.member_id,
                                                  conversation_id=conversation_id)
            messages = conversation.messages if conversation is not None else []
            return voice_lane.recent_history([{"role": m.role, "content": m.content} for m in messages])

    def _store(self, answer: str) -> None:
        stats = self.done.stats if self.done is not None else None
        kwargs = dict(member_id=self.caller.member_id, conversation_id=self.settings.conversation_id)
        with self.session.runtime.sessions() as session:
            pictures = household_images.read(self.images, self.service.cfg.limits) if self.images else ()
            stored = convs.add_message(session, **kwargs, role="user", content=self.transcript, images=pictures)
            if stored is None or not answer:  # deleted meanwhile, or cancelled before a word
                return
            convs.add_message(session, **kwargs, role="assistant", content=answer,
                              prompt_tokens=stats.prompt_tokens if stats else None,
                              output_tokens=stats.output_tokens if stats else None)
