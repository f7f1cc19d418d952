"""One voice turn: an utterance transcribed, answered on the voice lane, the exchange stored.

The turn formats the answer stream as the voice socket's events: `transcript.final`,
`response.delta` for each piece of text, `response.tool_calls` for each call as soon as it is
written whole, then `response.done` {text, finish_reason, timings} or `error` {code, message}.
While the answer is tool calls, it waits for the client's `tool.result` of each and answers again
with them (`MAX_TOOL_ROUNDS`, the last in words). Speech is the service's one speech turn
(`homeai.service.speech`); the answer follows the spoken-style system prompt and the last turns of
the conversation named. A cancelled turn (new speech, `response.cancel`) aborts its answer,
which the engine frees within one step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import replace

from homeai import tools as tool_calling
from homeai.api.openai import chat_template
from homeai.api.submit import submit
from homeai.api.voice_protocol import Settings, VoiceError
from homeai.engine.engine import TokenEvent
from homeai.sched.request import SamplingParams
from homeai.service.errors import ServiceError
from homeai.store import conversations as convs
from lanes import voice as voice_lane
from lanes.base import LanePolicy

log = logging.getLogger("homeai.voice")

LANE = "voice"
MAX_TOOL_ROUNDS = 4  # calls and results in one turn before the answer must be in words
TOOL_RESULT_TIMEOUT_S = 60.0  # a client that never answers a call ends its turn with an error


def answer_params(policy: LanePolicy) -> SamplingParams:
    """The sampling of a spoken answer (tests replace it to make answers long)."""
    return SamplingParams(max_tokens=policy.max_tokens or 160)


class Turn:
    """One utterance: transcribe it, answer it on the voice lane, store the exchange. `session` is
    the socket's `homeai.api.voice.VoiceSession`: who is asking, and `send` for the events."""

    def __init__(self, session, pcm: bytes, settings: Settings, ended_at: float):
        self.session, self.pcm, self.settings, self.ended_at = session, pcm, settings, ended_at
        self.runtime, self.caller = session.runtime, session.caller
        self.transcript: str | None = None
        self.parts: list[str] = []
        self.stt_ms: float | None = None
        self.ttft_ms: float | None = None
        self.stream = None
        self.closed = False  # the last event (response.done or error) is being sent
        self.waiting_for: dict[str, str] = {}  # the calls sent to the client, awaiting results: id -> name
        self.results: asyncio.Queue = asyncio.Queue()

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
            if self.stream is not None and self.stream.finished is None:
                self.stream.abort()

    async def _transcribe(self) -> str:
        s = self.settings
        transcript = await self.session.speech.transcribe(self.pcm, s.sample_rate, s.language, s.vad, need_words=True)
        self.stt_ms = self._ms()
        self.transcript = transcript.text
        await self.session.send({"type": "transcript.final", "text": transcript.text,
                                 "language": transcript.language, "duration_s": transcript.duration_s})
        return transcript.text

    async def _answer(self, question: str) -> None:
        """Answer, and while the answer is tool calls, send them and answer again with their results."""
        engine = self.runtime.engine
        if engine is None:
            raise VoiceError("model_loading", "the model is still loading; retry shortly")
        history = await asyncio.to_thread(self._history)
        messages = voice_lane.build_messages(question, history)
        for round_ in range(MAX_TOOL_ROUNDS):
            # The session's choice holds for the first answer; after results the model may answer in
            # words, and on the last round it must.
            choice = self.settings.tool_choice if round_ == 0 else "none" if round_ == MAX_TOOL_ROUNDS - 1 else "auto"
            plan = tool_plan(engine.runner, self.settings.tools, choice)
            self.stream = await _submit(engine, messages, self.caller.name, plan, self.runtime.cfg.grammar)
            reason, calls = await self._stream_answer(plan)
            if not calls:
                break
            messages = [*messages, *await self._call_tools(calls)]
        await self.finish(reason)

    async def _stream_answer(self, plan) -> tuple[str, tuple]:
        """Send the answer's words as they come (text that may open a call held back) and each call
        as soon as it is written whole; its finish reason and its calls, if it made any."""
        calls = plan.stream() if plan is not None else None
        async for event in self.stream:
            if isinstance(event, TokenEvent) and self.ttft_ms is None:
                self.ttft_ms = self._ms()
            if isinstance(event, TokenEvent) and event.text:
                await self._delta(calls.feed(event.text) if calls is not None else event.text)
                if calls is not None:
                    await self._send_calls(calls.new_calls())
        finish = self.stream.finished
        if finish.reason == "error":
            raise VoiceError("generation_failed", f"generation failed: {finish.error}")
        if finish.reason == "abort":
            raise VoiceError("aborted", "the answer was aborted (the server is stopping)")
        if calls is None:
            await self._delta(finish.text)
            return finish.reason, ()
        calls.feed(finish.text)
        rest, reply = calls.finish()
        await self._delta(rest)
        await self._send_calls([c for c in reply.calls if c.id not in self.waiting_for])
        return finish.reason, reply.calls

    async def _send_calls(self, calls) -> None:
        """Send calls the client may run now (their results are awaited once the answer ends)."""
        if calls:
            self.waiting_for.update((c.id, c.name) for c in calls)
            await self.session.send({"type": "response.tool_calls", "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]})

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
        await self.session.send({"type": "response.delta", "text": text})

    async def finish(self, reason: str) -> None:
        """Send `response.done` and store the exchange (stop, length, cancelled or interrupted)."""
        self.closed = True
        text = "".join(self.parts)
        await self.session.send({"type": "response.done", "text": text, "finish_reason": reason,
                                 "timings": {"stt_ms": self.stt_ms, "ttft_ms": self.ttft_ms, "total_ms": self._ms()}})
        if self.transcript and self.settings.conversation_id is not None:
            await asyncio.to_thread(self._store, text)

    async def _fail(self, code: str, message: str) -> None:
        self.closed = True
        await self.session.send({"type": "error", "code": code, "message": message})

    def _ms(self) -> float:
        return round((time.perf_counter() - self.ended_at) * 1000.0, 1)

    def _history(self) -> list[dict]:
        """The turns of the conversation named, if any, that the voice lane answers after."""
        conversation_id = self.settings.conversation_id
        if conversation_id is None:
            return []
        with self.runtime.sessions() as session:
            conversation = convs.get_conversation(session, member_id=self.caller.member_id,
                                                  conversation_id=conversation_id)
            messages = conversation.messages if conversation is not None else []
            return voice_lane.recent_history([{"role": m.role, "content": m.content} for m in messages])

    def _store(self, answer: str) -> None:
        stats = self.stream.finished.stats if self.stream is not None and self.stream.finished else None
        kwargs = dict(member_id=self.caller.member_id, conversation_id=self.settings.conversation_id)
        with self.runtime.sessions() as session:
            stored = convs.add_message(session, **kwargs, role="user", content=self.transcript)
            if stored is None or not answer:  # deleted meanwhile, or cancelled before a word
                return
            convs.add_message(session, **kwargs, role="assistant", content=answer,
                              prompt_tokens=stats.prompt_tokens if stats else None,
                              output_tokens=stats.output_tokens if stats else None)


async def _submit(engine, messages: list[dict], member: str, plan, limits):
    """Queue the answer through the API's one submit path; a refusal becomes a `VoiceError`."""
    template = chat_template(engine.runner, plan)
    params = answer_params(engine.policies[LANE])
    if plan is not None:
        params = replace(params, grammar=await asyncio.to_thread(plan.grammar, limits))  # checked at session.start
    try:
        return await submit(engine, lambda: template(messages),
                            lane=LANE, member=member, params=params, prompt_param="messages")
    except ServiceError as error:
        raise VoiceError(error.code, error.message) from None


async def check_tools(runtime, settings: Settings) -> None:
    """The session's tools, checked before its first question (blocking work off the loop)."""
    if runtime.engine is None:
        raise VoiceError("model_loading", "the model is still loading; retry shortly")
    runner = runtime.engine.runner
    plan = await asyncio.to_thread(tool_plan, runner, settings.tools, settings.tool_choice)
    if plan is not None:
        await asyncio.to_thread(check_grammar, plan, runner, runtime.cfg.grammar)


def tool_plan(runner, tools: list | None, tool_choice):
    """The session's tools in the model's call format (None without tools, or with choice "none")."""
    try:
        return tool_calling.plan(tools, tool_choice,
                                 template_source=runner.chat.template.source if runner.chat.template else None)
    except tool_calling.ToolError as e:
        raise VoiceError("invalid_tools", str(e)) from None


def check_grammar(plan, runner, limits) -> None:
    """A tool schema past the `[grammar]` limits or beyond the grammar converter or llama.cpp is refused
    at session.start (`checked_grammar`: blocking, called off the loop)."""
    try:
        tool_calling.checked_grammar(plan.grammar, runner, limits)
    except tool_calling.ToolError as e:
        raise VoiceError("invalid_tools", str(e)) from None
