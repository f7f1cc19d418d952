"""WebSocket `/v1/voice`: a spoken question in, the answer streamed out, on the voice lane.

JSON text frames and binary audio frames (PCM16 little-endian mono); docs/voice.md ("The voice
socket") is the protocol's reference. In short:

    client: {"type": "session.start", "sample_rate": 16000, "language"?, "vad"?, "conversation_id"?, "token"?,
             "tools"?, "speak"?, "voice"?}
            {"type": "input_image", "image": "data:image/jpeg;base64,..."} (read with the next utterance),
            binary PCM16 frames, then {"type": "audio.end"}; {"type": "response.cancel"};
            {"type": "tool.result", "tool_call_id"?, "content"} for each call the answer made
    server: session.ready, image.ready {images}, transcript.final {text}, response.delta {text}...,
            response.tool_calls {tool_calls [{id, name, arguments}]} as each call is written whole
            (the answer over, the turn waits for their results),
            response.done {text, finish_reason, timings {stt_ms, ttft_ms, total_ms}}, error {code, message, param?};
            with "speak": response.audio.start {sample_rate}, binary PCM16 frames, response.audio.done
            (`homeai.api.voice_audio`), and timings' first_audio_ms

One `VoiceSession` per socket (here) reads messages (`homeai.api.voice_protocol` checks them) and
buffers the utterance; at most one `Turn` task at a time (`homeai.api.voice_turn`) transcribes it
with the service's speech in (`service.hearing`: `homeai.service.hearing`), formats the service's answer stream
(`service.chat`) as the events above and stores the exchange: no runner or engine here. New
speech, `response.cancel` or a new `session.start` cancels the turn (its synthesis too) and
aborts its sequence, which the engine frees within one step. Every accepted utterance ends with
exactly one `response.done` or `error`. The socket is closed with 4401 without a valid token
when auth is required, or once its token is revoked (checked every few seconds and before each
turn: `homeai.api.revocation`), with 4403 after an `error` {code: lane_not_allowed} at
`session.start` when the member may not use the voice lane (`homeai members lanes`), and with
4429 when the member already holds `server.max_websockets_per_member` sockets, or when its
client address already has `server.max_unauthenticated_websockets_per_address` sockets waiting
for a token; a page of another origin gets a 403 at the handshake (`homeai.api.origin`). A
session that fails unexpectedly is closed with 1011, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from homeai.api.auth import Caller, bearer, caller_of
from homeai.api.limits import TooMany
from homeai.api.revocation import Hold, Revocations, revoked_tokens
from homeai.api.voice_protocol import (AUTH_TIMEOUT_S, CLOSE_FORBIDDEN, CLOSE_INTERNAL_ERROR, CLOSE_TOO_MANY,
                                       MAX_MESSAGE_BYTES, PRE_ROLL_S, CloseSocket, Settings, Unauthorized,
                                       VoiceError, at_16k, error_event, parse, parse_settings)
from homeai.api.voice_audio import voice_for
from homeai.api.voice_turn import LANE, Turn, check_conversation
from homeai.service import ServiceError, images

log = logging.getLogger("homeai.voice")
router = APIRouter(tags=["voice"])


@router.websocket("/v1/voice")
async def voice(websocket: WebSocket) -> None:
    await websocket.accept()  # a page of another origin was refused before (homeai.api.origin)
    state = websocket.app.state
    session = VoiceSession(websocket, state.runtime, state.service, state.revocations)
    try:
        await session.run()
    finally:
        await session.cancel_turn(None)
        session.release()


class VoiceSession:
    """One socket: who is calling, the session's settings, the utterance being heard, the turn answering."""

    def __init__(self, websocket: WebSocket, runtime, service, revocations: Revocations):
        self.ws, self.runtime, self.service, self.revocations = websocket, runtime, service, revocations
        self.hearing = service.hearing  # speech in: the service's one speech turn
        self.speaking = service.speaking  # speech out, for a session that speaks
        self.voice = None  # the voice answers are spoken with (voice_audio.Voice); None: not spoken
        self.hold: Hold | None = None  # the token in use, watched for its revocation
        self.address = websocket.client.host if websocket.client else "unknown"
        self.waiting = False  # holds one of the address's units for sockets without a token
        self.caller: Caller | None = None
        self.settings: Settings | None = None
        self.pcm = bytearray()
        self.images: list[str] = []  # `input_image`s (data URLs, read and checked) the next utterance asks about
        self.overflowed = False  # the utterance went over the limit: drop its audio until it ends
        self.max_bytes, self.limit_s = 0, 0.0
        self.detector = None  # the speech model's EndOfSpeechDetector, with server VAD
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
                except (VoiceError, ServiceError) as e:
                    await self.send(error_event(e))
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
            message = parse(text)
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
        elif kind == "input_image":
            self._started()
            await self._add_image(message)
        elif kind == "tool.result":
            self._started()
            if not self._turn_running() or not self.turn.waiting_for:
                raise VoiceError("no_tool_call", "no tool call is waiting for a result")
            self.turn.tool_result(message)
        else:
            raise VoiceError("unknown_type", f"unknown message type {kind!r} "
                             "(known: session.start, input_image, audio.end, response.cancel, tool.result)")

    async def _start(self, message: dict) -> None:
        self.told_not_started = False
        token = message.get("token")
        if token is not None and not isinstance(token, str):
            raise Unauthorized("token must be a string")
        if token or self.caller is None:
            await self._authenticate(token)
        await self._allow_voice()
        settings = parse_settings(message)
        speech = self.hearing
        limit_s = speech.max_utterance_s()  # no speech model: the error says why
        voice = voice_for(self.speaking, settings)  # speaking without speech synthesis, or an unknown voice
        await self.service.check_tools(settings.tools, settings.tool_choice, self.caller)  # refused here, not at the first question
        await asyncio.to_thread(check_conversation, self.runtime, self.caller, settings.conversation_id)
        await self.cancel_turn("cancelled")
        self.settings, self.limit_s, self.voice = settings, limit_s, voice
        self.images.clear()
        self.max_bytes = 2 * int(limit_s * settings.sample_rate)
        self.detector = await asyncio.to_thread(speech.end_of_speech_detector) if settings.vad else None
        self._reset_utterance()
        await self.send({"type": "session.ready", "member": self.caller.name, "sample_rate": settings.sample_rate,
                         "language": settings.language, "vad": settings.vad,
                         "conversation_id": settings.conversation_id, "max_utterance_s": limit_s,
                         "max_message_bytes": MAX_MESSAGE_BYTES, "speak": voice is not None,
                         **({"voice": voice.name, "audio_sample_rate": voice.sample_rate} if voice else {})})

    async def _add_image(self, message: dict) -> None:
        """An image the next utterance asks about ("is someone at the door?"), read and checked now: a bad
        one is an `error` at once, and is not kept."""
        url = message.get("image")
        if not isinstance(url, str):
            raise VoiceError("invalid_image", "input_image needs `image`: a data URL (data:image/...;base64,...)",
                             "image")
        if not self.service.sees():
            raise VoiceError("images_unsupported", "this model cannot read images: it has no vision projector "
                             "([model] mmproj)", "image")
        limits = self.service.cfg.limits
        if len(self.images) >= limits.max_images:
            raise VoiceError("too_many_images", f"at most {limits.max_images} images with one utterance "
                             "([limits] max_images)", "image")
        try:
            await asyncio.to_thread(images.from_url, url, limits)
        except images.ImageRefused as e:
            raise VoiceError("invalid_image", str(e), "image") from None
        self.images.append(url)
        await self.send({"type": "image.ready", "images": len(self.images)})

    async def _allow_voice(self) -> None:
        """A member who may not use the voice lane is told so (an `error` naming their lanes), then closed 4403."""
        try:
            self.service.lane(self.caller, LANE, LANE)
        except ServiceError as e:
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
        ended = self.detector is not None and self.detector.feed(at_16k(data, settings.sample_rate))
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
        self.turn = Turn(self, pcm, self.settings, ended_at, tuple(self.images))
        self.images.clear()  # (one utterance's: the next question brings its own)
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

    async def send(self, event: dict | bytes) -> None:
        """An event, or a frame of audio (bytes)."""
        if self.gone:
            return
        async with self._send_lock:
            try:
                await (self.ws.send_bytes(event) if isinstance(event, bytes) else
                       self.ws.send_text(json.dumps(event, ensure_ascii=False, separators=(",", ":"))))
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.gone = True  # the client left; the receive loop sees the disconnect

    async def _authenticate(self, token: str | None) -> None:
        token = token.strip() if token and token.strip() else None
        try:
            caller = await asyncio.to_thread(caller_of, self.runtime, token)
        except ServiceError:
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
