"""WebSocket `/v1/voice`: a spoken question in, the answer streamed out, on the voice lane.

JSON text frames and binary audio frames (PCM16 little-endian mono); the README's "Voice"
section is the protocol's reference. In short:

    client: {"type": "session.start", "sample_rate": 16000, "language"?, "vad"?, "conversation_id"?, "token"?,
             "tools"?}
            binary PCM16 frames, then {"type": "audio.end"}; {"type": "response.cancel"};
            {"type": "tool.result", "tool_call_id"?, "content"} for each call the answer made
    server: session.ready, transcript.final {text}, response.delta {text}...,
            response.tool_calls {tool_calls [{id, name, arguments}]} as each call is written whole
            (the answer over, the turn waits for their results),
            response.done {text, finish_reason, timings {stt_ms, ttft_ms, total_ms}}, error {code, message}

One `VoiceSession` per socket reads messages and buffers the utterance; at most one `Turn`
task at a time transcribes it (on the speech model's bounded pool), answers it through the
engine and stores the exchange. New speech, `response.cancel` or a new `session.start`
cancels the turn and aborts its sequence, which the engine frees within one step. Every
accepted utterance ends with exactly one `response.done` or `error`. The socket is closed
with 4401 without a valid token when auth is required, or once its token is revoked (checked
every few seconds and before each turn: `homeai.api.revocation`), with 4403 after an `error`
{code: lane_not_allowed} at `session.start` when the member may not use the voice lane
(`homeai members lanes`), and with 4429 when the member already holds
`server.max_websockets_per_member` sockets, or when its client address already has
`server.max_unauthenticated_websockets_per_address` sockets waiting for a token; a page of
another origin gets a 403 at the handshake (`homeai.api.origin`). A session that fails
unexpectedly is closed with 1011, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from homeai import tools as tool_calling
from homeai.api.auth import Caller, allow_lane, bearer, caller_of
from homeai.api.errors import ApiError
from homeai.api.limits import TooMany
from homeai.api.revocation import Hold, Revocations, revoked_tokens
from homeai.api.schemas import MAX_INT64, find_invalid_text
from homeai.api.openai import chat_template
from homeai.api.submit import submit
from homeai.engine.engine import TokenEvent
from homeai.sched.request import SamplingParams
from homeai.speech.base import MAX_RATE, MIN_RATE, AudioError, SpeechBusy, resample
from homeai.store import conversations as convs
from lanes import voice as voice_lane
from lanes.base import LanePolicy

if TYPE_CHECKING:  # speech is optional: its libraries are imported once a speech model has loaded
    from homeai.speech.stt import EndOfSpeechDetector

log = logging.getLogger("homeai.voice")
router = APIRouter(tags=["voice"])

LANE = "voice"
# One message; 8 s of 16 kHz audio. A larger one gets an error and is dropped (and one over
# server.max_ws_message_bytes closes the socket: uvicorn's hard cap).
MAX_MESSAGE_BYTES = 256 * 1024
AUTH_TIMEOUT_S = 10.0  # an unauthenticated socket must send session.start with a token by then
PRE_ROLL_S = 1.0  # with server VAD, the audio kept from before the speech starts
CLOSE_UNAUTHORIZED, CLOSE_FORBIDDEN, CLOSE_TOO_MANY, CLOSE_INTERNAL_ERROR = 4401, 4403, 4429, 1011
LANGUAGE = re.compile(r"^[a-z]{2,3}$")
MAX_TOOL_ROUNDS = 4  # calls and results in one turn before the answer must be in words
TOOL_RESULT_TIMEOUT_S = 60.0  # a client that never answers a call ends its turn with an error


class VoiceError(Exception):
    """Sent to the client as an `error` event; the socket stays usable."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class CloseSocket(Exception):
    """Ends the session: the socket is closed with `code`."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


class Unauthorized(CloseSocket):
    def __init__(self, reason: str):
        super().__init__(CLOSE_UNAUTHORIZED, reason)


@dataclass(frozen=True)
class Settings:
    sample_rate: int
    language: str | None  # None: detected
    vad: bool
    conversation_id: int | None
    tools: list | None = None  # OpenAI-shaped tool definitions (checked by homeai.tools at session.start)
    tool_choice: object = None


def answer_params(policy: LanePolicy) -> SamplingParams:
    """The sampling of a spoken answer (tests replace it to make answers long)."""
    return SamplingParams(max_tokens=policy.max_tokens or 160)


@router.websocket("/v1/voice")
async def voice(websocket: WebSocket) -> None:
    await websocket.accept()  # a page of another origin was refused before (homeai.api.origin)
    session = VoiceSession(websocket, websocket.app.state.runtime, websocket.app.state.revocations)
    try:
        await session.run()
    finally:
        await session.cancel_turn(None)
        session.release()


class VoiceSession:
    def __init__(self, websocket: WebSocket, runtime, revocations: Revocations):
        self.ws, self.runtime, self.revocations = websocket, runtime, revocations
        self.hold: Hold | None = None  # the token in use, watched for its revocation
        self.address = websocket.client.host if websocket.client else "unknown"
        self.waiting = False  # holds one of the address's units for sockets without a token
        self.caller: Caller | None = None
        self.member_id: int | None = None
        self.settings: Settings | None = None
        self.pcm = bytearray()
        self.overflowed = False  # the utterance went over the limit: drop its audio until it ends
        self.max_bytes, self.limit_s = 0, 0.0
        self.stt = None  # the runtime's SpeechToText, once a session has started
        self.detector: EndOfSpeechDetector | None = None
        self.turn: Turn | None = None
        self.task: asyncio.Task | None = None
        self.gone = False
        self.told_not_started = False
        self._send_lock = asyncio.Lock()

    # ---- the receive loop --------------------------------------------------------

    async def run(self) -> None:
        token = self.ws.query_params.get("token") or bearer(self.ws.headers.get("authorization"))
        try:
            if token or not self.runtime.cfg.auth.required:
                await self._authenticate(token)
            if self.caller is None:
                self._wait_for_token()
            while not self.gone:
                message = await self._receive(AUTH_TIMEOUT_S if self.caller is None else None)
                if message["type"] == "websocket.disconnect":
                    return
                try:
                    if message.get("bytes") is not None:
                        await self._on_audio(message["bytes"])
                    else:
                        await self._on_text(message.get("text") or "")
                except VoiceError as e:
                    await self.send({"type": "error", "code": e.code, "message": e.message})
        except CloseSocket as e:
            await self.cancel_turn(None)
            await self._close(e.code, e.reason)
        except WebSocketDisconnect:
            return
        except Exception:  # a bug: say so with a close frame rather than drop the connection
            log.exception("voice session failed")
            await self.cancel_turn(None)
            await self._close(CLOSE_INTERNAL_ERROR, "internal error (see the server log)")

    async def _receive(self, timeout: float | None) -> dict:
        """The next message; Unauthorized when none came in time or the token is revoked meanwhile."""
        self._refuse_if_revoked()
        waits = {receiving := asyncio.ensure_future(self.ws.receive())}
        if self.hold is not None:
            waits.add(asyncio.ensure_future(self.hold.revoked.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()  # a no-op for the one that finished
        if receiving.done() and not receiving.cancelled():
            return receiving.result()
        self._refuse_if_revoked()
        raise Unauthorized("no session.start with a valid token in time")

    def _refuse_if_revoked(self) -> None:
        if self.hold is not None and self.hold.revoked.is_set():
            raise Unauthorized("the token has been revoked")

    async def _close(self, code: int, reason: str) -> None:
        try:
            await self.ws.close(code=code, reason=reason[:120])
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # already gone

    async def _on_text(self, text: str) -> None:
        try:
            if len(text.encode()) > MAX_MESSAGE_BYTES:
                raise VoiceError("message_too_large", f"a message may have at most {MAX_MESSAGE_BYTES} bytes")
            message = _parse(text)
        except VoiceError:
            if self.caller is None:
                raise Unauthorized("authenticate with session.start first") from None
            raise
        kind = message.get("type")
        if self.caller is None and kind != "session.start":
            raise Unauthorized("authenticate with session.start first")
        if kind == "session.start":
            await self._start(message)
        elif kind == "audio.end":
            self._started()
            await self._end_of_utterance()
        elif kind == "response.cancel":
            self._started()
            await self.cancel_turn("cancelled")
        elif kind == "tool.result":
            self._started()
            if not self._turn_running() or not self.turn.waiting_for:
                raise VoiceError("no_tool_call", "no tool call is waiting for a result")
            self.turn.tool_result(message)
        else:
            raise VoiceError("unknown_type", f"unknown message type {kind!r} "
                             "(known: session.start, audio.end, response.cancel, tool.result)")

    async def _start(self, message: dict) -> None:
        self.told_not_started = False
        token = message.get("token")
        if token is not None and not isinstance(token, str):
            raise Unauthorized("token must be a string")
        if token or self.caller is None:
            await self._authenticate(token)
        await self._allow_voice()
        settings = _settings(message)
        stt = _speech(self.runtime)
        if self.runtime.engine is None:
            raise VoiceError("model_loading", "the model is still loading; retry shortly")
        plan = await asyncio.to_thread(_tool_plan, self.runtime.engine.runner, settings.tools, settings.tool_choice)
        if plan is not None:  # bad tools are refused here, not at the first question
            await asyncio.to_thread(_check_grammar, plan, self.runtime.engine.runner, self.runtime.cfg.grammar)
        self.member_id = await asyncio.to_thread(self._check_conversation, settings.conversation_id)
        await self.cancel_turn("cancelled")
        limit_s = min(self.runtime.cfg.speech.max_utterance_s, stt.cfg.max_utterance_s)
        self.settings, self.stt, self.limit_s = settings, stt, limit_s
        self.max_bytes = 2 * int(limit_s * settings.sample_rate)
        self.detector = await asyncio.to_thread(_end_of_speech_detector) if settings.vad else None
        self._reset_utterance()
        await self.send({"type": "session.ready", "member": self.caller.name, "sample_rate": settings.sample_rate,
                         "language": settings.language, "vad": settings.vad,
                         "conversation_id": settings.conversation_id, "max_utterance_s": limit_s,
                         "max_message_bytes": MAX_MESSAGE_BYTES})

    async def _allow_voice(self) -> None:
        """A member who may not use the voice lane is told so (an `error` naming their lanes), then closed 4403."""
        try:
            allow_lane(self.caller, LANE)
        except ApiError as e:
            await self.send({"type": "error", "code": e.code, "message": e.message})
            raise CloseSocket(CLOSE_FORBIDDEN, "the voice lane is not one this member may use") from None

    async def _on_audio(self, data: bytes) -> None:
        if self.caller is None:
            raise Unauthorized("authenticate with session.start first")
        if len(data) > MAX_MESSAGE_BYTES:
            raise VoiceError("message_too_large", f"an audio frame may have at most {MAX_MESSAGE_BYTES} bytes "
                             "(send small frames, e.g. 20 ms)")
        if self.settings is None:  # said once: a client streaming before its session would get one per frame
            if self.told_not_started:
                return
            self.told_not_started = True
        settings = self._started()
        if len(data) % 2:
            raise VoiceError("invalid_audio_frame", f"PCM16 frames have an even number of bytes, got {len(data)}")
        ended = self.detector is not None and self.detector.feed(_at_16k(data, settings.sample_rate))
        if self._turn_running() and (self.detector is None or self.detector.heard_speech):
            await self.cancel_turn("interrupted")  # barge-in: a new utterance has started
        if not self.overflowed:
            self._buffer(data)
        if len(self.pcm) > self.max_bytes:
            self._reset_utterance(overflowed=True)
            await self.send({"type": "error", "code": "utterance_too_long",
                             "message": f"the utterance is over the {self.limit_s:g} s limit "
                                        "(speech.max_utterance_s); its audio is dropped until it ends"})
        if ended:
            await self._end_of_utterance()

    def _buffer(self, data: bytes) -> None:
        self.pcm += data
        if self.detector is not None and not self.detector.heard_speech:
            keep = 2 * int(PRE_ROLL_S * self.settings.sample_rate)
            del self.pcm[:-keep]

    async def _end_of_utterance(self) -> None:
        ended_at = time.perf_counter()
        pcm, overflowed = bytes(self.pcm), self.overflowed
        self._reset_utterance()
        if overflowed:
            return  # its error was sent when it went over
        if not pcm:
            raise VoiceError("no_audio", "audio.end without audio: send binary PCM16 frames first")
        await self.cancel_turn("interrupted")
        hold = self.hold  # no turn for a token revoked since the last check
        if hold is not None and await asyncio.to_thread(revoked_tokens, self.runtime.sessions, [hold.token_hash]):
            hold.revoked.set()
        self._refuse_if_revoked()
        self.turn = Turn(self, pcm, self.settings, ended_at)
        self.task = asyncio.create_task(self.turn.run())

    def _reset_utterance(self, overflowed: bool = False) -> None:
        self.pcm.clear()
        self.overflowed = overflowed
        if self.detector is not None:
            self.detector.reset()

    # ---- turns -------------------------------------------------------------------------

    def _turn_running(self) -> bool:
        return self.task is not None and not self.task.done() and not self.turn.closed

    async def cancel_turn(self, reason: str | None) -> None:
        """Stop the turn in progress; with a reason, tell the client (`response.done`)."""
        task, turn = self.task, self.turn
        if task is None or task.done():
            return
        if turn.closed:  # already telling the client how it ended: let it finish
            await asyncio.gather(task, return_exceptions=True)
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if reason is not None:
            await turn.finish(reason)

    # ---- helpers -------------------------------------------------------------------------

    async def send(self, event: dict) -> None:
        if self.gone:
            return
        async with self._send_lock:
            try:
                await self.ws.send_text(json.dumps(event, ensure_ascii=False, separators=(",", ":")))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.gone = True  # the client left; the receive loop sees the disconnect

    async def _authenticate(self, token: str | None) -> None:
        token = token.strip() if token and token.strip() else None
        try:
            caller = await asyncio.to_thread(caller_of, self.runtime, token)
        except ApiError:
            raise Unauthorized("missing, invalid or revoked token") from None
        if self.caller is None or caller.name != self.caller.name:
            try:  # each member may hold only so many sockets open (server.max_websockets_per_member)
                self.runtime.websockets.acquire(caller.name)
            except TooMany as e:
                raise CloseSocket(CLOSE_TOO_MANY, str(e)) from None
            self.release()
        self.caller = caller
        self._stop_waiting()
        self._hold(token)

    def _hold(self, token: str | None) -> None:
        """Watch the token now in use (none: nothing to revoke, auth is off)."""
        if self.hold is not None:
            self.revocations.release(self.hold)
        self.hold = self.revocations.hold(token) if token else None

    def _wait_for_token(self) -> None:
        try:  # each address may hold only so many sockets open without a token
            self.runtime.unauthenticated.acquire(self.address)
        except TooMany as e:
            raise CloseSocket(CLOSE_TOO_MANY, str(e)) from None
        self.waiting = True

    def _stop_waiting(self) -> None:
        if self.waiting:
            self.runtime.unauthenticated.release(self.address)
            self.waiting = False

    def release(self) -> None:
        """Give back the member's socket unit (or the address's, when it never had a token) and the token's hold."""
        self._stop_waiting()
        self._hold(None)
        if self.caller is not None:
            self.runtime.websockets.release(self.caller.name)
            self.caller = None

    def _started(self) -> Settings:
        if self.settings is None:
            raise VoiceError("session_not_started", "send session.start first")
        return self.settings

    def _check_conversation(self, conversation_id: int | None) -> int | None:
        """The member's id when a conversation is named, after checking it is theirs."""
        if conversation_id is None:
            return None
        member_id = self.caller.member_id
        with self.runtime.sessions() as session:
            found = convs.get_conversation(session, member_id=member_id, conversation_id=conversation_id) is not None
        if not found:
            raise VoiceError("conversation_not_found", f"no conversation {conversation_id} of yours")
        return member_id


class Turn:
    """One utterance: transcribe it, answer it on the voice lane, store the exchange."""

    def __init__(self, session: VoiceSession, pcm: bytes, settings: Settings, ended_at: float):
        self.session, self.pcm, self.settings, self.ended_at = session, pcm, settings, ended_at
        self.member, self.member_id = session.caller.name, session.member_id
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
        except VoiceError as e:
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
        engine = self.session.runtime.engine
        pause = engine is not None and self.session.runtime.cfg.speech.pause_background
        try:
            with engine.background_paused() if pause else contextlib.nullcontext():
                transcript = await self.session.stt.transcribe_pcm16_async(
                    self.pcm, s.sample_rate, s.language, s.vad)
        except AudioError as e:
            raise VoiceError("invalid_audio", str(e)) from None
        except SpeechBusy as e:
            raise VoiceError("speech_busy", str(e)) from None
        self.stt_ms = self._ms()
        if not transcript.text:
            raise VoiceError("no_speech", "no speech was heard in the utterance")
        self.transcript = transcript.text
        await self.session.send({"type": "transcript.final", "text": transcript.text,
                                 "language": transcript.language, "duration_s": transcript.duration_s})
        return transcript.text

    async def _answer(self, question: str) -> None:
        """Answer, and while the answer is tool calls, send them and answer again with their results."""
        engine = self.session.runtime.engine
        if engine is None:
            raise VoiceError("model_loading", "the model is still loading; retry shortly")
        history = await asyncio.to_thread(self._history)
        messages = voice_lane.build_messages(question, history)
        for round_ in range(MAX_TOOL_ROUNDS):
            # The session's choice holds for the first answer; after results the model may answer in
            # words, and on the last round it must.
            choice = self.settings.tool_choice if round_ == 0 else "none" if round_ == MAX_TOOL_ROUNDS - 1 else "auto"
            plan = _tool_plan(engine.runner, self.settings.tools, choice)
            self.stream = await _submit(engine, messages, self.member, plan, self.session.runtime.cfg.grammar)
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
        with self.session.runtime.sessions() as session:
            conversation = convs.get_conversation(session, member_id=self.member_id,
                                                  conversation_id=conversation_id)
            messages = conversation.messages if conversation is not None else []
            return voice_lane.recent_history([{"role": m.role, "content": m.content} for m in messages])

    def _store(self, answer: str) -> None:
        stats = self.stream.finished.stats if self.stream is not None and self.stream.finished else None
        kwargs = dict(member_id=self.member_id, conversation_id=self.settings.conversation_id)
        with self.session.runtime.sessions() as session:
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
    except ApiError as error:
        raise VoiceError(error.code, error.message) from None


def _tool_plan(runner, tools: list | None, tool_choice):
    """The session's tools in the model's call format (None without tools, or with choice "none")."""
    try:
        return tool_calling.plan(tools, tool_choice,
                                 template_source=runner.chat.template.source if runner.chat.template else None)
    except tool_calling.ToolError as e:
        raise VoiceError("invalid_tools", str(e)) from None


def _check_grammar(plan, runner, limits) -> None:
    """A tool schema past the `[grammar]` limits or beyond the grammar converter or llama.cpp is refused
    at session.start (`checked_grammar`: blocking, called off the loop)."""
    try:
        tool_calling.checked_grammar(plan.grammar, runner, limits)
    except tool_calling.ToolError as e:
        raise VoiceError("invalid_tools", str(e)) from None


def _parse(text: str) -> dict:
    try:
        message = json.loads(text)
    except ValueError as e:
        raise VoiceError("invalid_json", f"a text frame must be JSON: {e}") from None
    except RecursionError:
        raise VoiceError("invalid_json", "a text frame must be JSON: it is nested too deeply") from None
    if not isinstance(message, dict):
        raise VoiceError("invalid_json", "a text frame must be a JSON object with a type")
    path = find_invalid_text(message)
    if path is not None:
        raise VoiceError("invalid_text", f"{path}: not valid Unicode text (a lone surrogate, \\ud800-\\udfff)")
    return message


def _settings(message: dict) -> Settings:
    rate = message.get("sample_rate")
    if not isinstance(rate, int) or isinstance(rate, bool):
        raise VoiceError("invalid_value", f"session.start needs sample_rate, an integer in Hz, got {rate!r}")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise VoiceError("unsupported_sample_rate",
                         f"unsupported sample rate {rate} Hz (accepted: {MIN_RATE}..{MAX_RATE}, best 16000)")
    language = message.get("language", "en")
    if language is not None and not (isinstance(language, str) and LANGUAGE.match(language)):
        raise VoiceError("invalid_value", f"language must be a language code like 'en', or null, got {language!r}")
    vad = message.get("vad", False)
    if not isinstance(vad, bool):
        raise VoiceError("invalid_value", f"vad must be true or false, got {vad!r}")
    tools = message.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise VoiceError("invalid_tools", "tools must be a list of OpenAI tool definitions")
    conversation_id = message.get("conversation_id")
    if conversation_id is not None and (not isinstance(conversation_id, int) or isinstance(conversation_id, bool)
                                        or not 1 <= conversation_id <= MAX_INT64):  # a database id, as the routes take
        raise VoiceError("invalid_value", f"conversation_id must be an integer 1..{MAX_INT64}, got {conversation_id!r}")
    return Settings(rate, language, vad, conversation_id, tools or None, message.get("tool_choice"))


def _end_of_speech_detector() -> EndOfSpeechDetector:
    from homeai.speech.stt import EndOfSpeechDetector  # importable: `_speech` found a loaded speech model

    return EndOfSpeechDetector()


def _speech(runtime):
    stt = runtime.stt
    if stt is None:
        reason = runtime.stt_error or ("speech to text is still loading; retry shortly"
                                       if runtime.engine is None else "speech to text is not loaded")
        raise VoiceError("speech_unavailable", reason)
    return stt


def _at_16k(pcm: bytes, sample_rate: int) -> bytes:
    """PCM16 at the session's rate -> PCM16 at 16 kHz, what the end-of-speech detector hears."""
    if sample_rate == 16000:
        return pcm
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    return resample(audio, sample_rate).astype("<i2").tobytes()
