"""The voice socket's spoken answers: an answer's text in, PCM16 frames out, as sentences are synthesised.

A session started with `"speak": true` (and an optional `"voice"`, one of the loaded voices'
names; the default voice without) has each answer spoken as well as written:

    server: transcript.final
            response.audio.start {sample_rate}        before the answer's first word
            response.delta {text}...  and, interleaved, binary frames: PCM16 little-endian mono at
                                      sample_rate, at most FRAME_S seconds each, sent as each
                                      sentence of the answer is synthesised
            response.audio.done {error?}              the answer's audio is all sent (or stopped);
                                      `error` {code, message} when synthesis failed midway
            response.done {..., timings {..., first_audio_ms}}   or `error`, always after audio.done

`first_audio_ms` is from the end of speech to the first frame sent (null when none was). The
audio says what the `response.delta`s show: with tools, the calls are never spoken, the answer
in words is. New speech (barge-in), `response.cancel` or a client that leaves stop synthesis at
once: once the server has handled the cancel, no frame of that answer follows (frames already
sent are the client's to drop: a player stops its playback when its member speaks again).
Refused at `session.start`: an unknown voice (`error` with `param` "voice"), speech synthesis
not loaded (`error` {code: tts_unavailable} saying why); sessions without `speak` never need it.

Synthesis is the service's (`homeai.service.speaking`): on the voice lane, before chat and
background synthesis, with the engine's background held while the first sentence is made, in
one of the member's own slots on the speech-out pool (`tts.voice_reserve` keeps some for voice).
A member at `tts.max_pending_per_member` gets `response.audio.done` with `error` {code:
tts_busy} naming that cap (the written answer goes on); so does a pool with no room left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from homeai.api.voice_protocol import Settings
from homeai.service import ServiceError

log = logging.getLogger("homeai.voice")

FRAME_S = 0.2  # the longest binary frame: a sentence's audio is sent in pieces this long
END = None  # put on the queue of text pieces when the answer is written


@dataclass(frozen=True)
class Voice:
    """The voice a session's answers are spoken with."""

    name: str
    sample_rate: int


def voice_for(speaking, settings: Settings) -> Voice | None:
    """At `session.start`: the voice to speak with (None without `speak`); refused with the
    service's ServiceError: tts_unavailable or model_loading, or invalid_value naming `voice`."""
    if not settings.speak:
        return None
    name = speaking.voice(settings.voice)
    return Voice(name, speaking.sample_rate(name))


class SpokenAnswer:
    """One answer's audio: `say` each piece of its text, then `finish` (all sent) or `stop` (at once).
    `session` is the socket's VoiceSession (its `send` takes events and frames)."""

    def __init__(self, session, speaking, voice: Voice, lane: str, ended_at: float):
        self.session, self.speaking, self.voice, self.lane, self.ended_at = session, speaking, voice, lane, ended_at
        self.member = session.caller.key  # whose share of the speech-out pool (read now: the socket may close)
        self.pieces: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.first_audio_ms: float | None = None
        self.error: dict | None = None  # synthesis failed: {code, message}
        self.num_frames = 0
        self.open = False  # response.audio.start sent, response.audio.done not yet

    async def begin(self) -> None:
        """Send `response.audio.start` and start synthesising what is said."""
        self.open = True
        await self.session.send({"type": "response.audio.start", "sample_rate": self.voice.sample_rate})
        self.task = asyncio.create_task(self._speak())

    def say(self, text: str) -> None:
        if self.task is not None and text:
            self.pieces.put_nowait(text)

    async def finish(self) -> None:
        """The text is all said: wait until its audio is all sent."""
        if self.task is not None:
            self.pieces.put_nowait(END)
            await asyncio.gather(self.task, return_exceptions=True)

    async def stop(self) -> None:
        """Stop synthesis and frames at once (a no-op once finished)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def close(self) -> None:
        """Send `response.audio.done` (once, after `begin`), the audio stopped first if it was not all sent."""
        await self.stop()
        if not self.open:
            return
        self.open = False
        event = {"type": "response.audio.done"}
        if self.error is not None:
            event["error"] = self.error
        await self.session.send(event)

    async def _speak(self) -> None:
        frames = self.speaking.speak_stream(self._text(), lane=self.lane, member=self.member, voice=self.voice.name)
        try:
            async with contextlib.aclosing(frames):
                async for pcm in frames:
                    await self._send(pcm)
                    if self.session.gone:
                        return  # the client left: stop synthesising for it
        except ServiceError as e:
            self.error = {"code": e.code, "message": e.message}
        except Exception:
            log.exception("speaking a voice answer failed")
            self.error = {"code": "internal_error", "message": "speech synthesis failed (see the server log)"}

    async def _text(self):
        while (piece := await self.pieces.get()) is not END:
            yield piece

    async def _send(self, pcm: bytes) -> None:
        step = 2 * round(FRAME_S * self.voice.sample_rate)
        for i in range(0, len(pcm), step):
            if self.first_audio_ms is None:
                self.first_audio_ms = round((time.perf_counter() - self.ended_at) * 1000.0, 1)
            await self.session.send(pcm[i:i + step])
            self.num_frames += 1
