"""One Wyoming connection: speech to text and text to speech as Home Assistant's voice pipeline asks.

    describe                                 -> info (`homeai.wyoming.info`: the asr and tts programs)
    transcribe {language?, name?}            (optional; language "en" unless given)
    audio-start {rate, width, channels}
    audio-chunk {rate, width, channels} + PCM ...
    audio-stop                               -> transcript {text, language} (no audio: text "")
                                                with `wyoming.transcript_streaming`: transcript-start,
                                                a transcript-chunk per Whisper segment as it is decoded,
                                                transcript (the whole text), transcript-stop
    synthesize, synthesize-start/-chunk/-stop -> audio (`homeai.wyoming.synthesis`)
    ping                                     -> pong

Audio is PCM16 (width 2) at 8..48 kHz with any number of channels, mixed down to mono here;
then handed to the service's speech in (`service.hearing`, `homeai.service.hearing`), as `/v1/voice` hands its
audio: resampled to 16 kHz, on the speech model's bounded pool, the engine's background lanes held
while it is transcribed (`speech.pause_background`), speech's errors with the same codes and texts.
A `WyomingError` (a bad frame, an event out of order, audio of another format than announced,
an utterance over `speech.max_utterance_s` or over `wyoming.max_audio_bytes` buffered) or a
client silent for `READ_TIMEOUT_S` (while it is sent no speech) gets an `error` event {text, code}
and the connection closes, its utterance dropped (what the client still sends is read and dropped
for a moment first, so that the close does not reset the socket and lose the event). An event whose text is not valid Unicode, or a
refused synthesis (`EventRefused`), gets an `error` event and is ignored; the connection goes on.
Unknown event types are ignored, as Wyoming services do. With `wyoming.member` set, each
utterance is refused at audio-start, and each synthesis at synthesize or synthesize-start
(`lane_not_allowed`, naming the lanes allowed), unless that member may use the voice lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass

import numpy as np

from homeai.service.errors import ServiceError
from homeai.speech.base import MAX_RATE, MIN_RATE
from homeai.wyoming.framing import Event, EventRefused, WyomingError, encode, read_event
from homeai.wyoming.info import DEFAULT_LANGUAGE, describe
from homeai.wyoming.synthesis import VOICE_LANE, Synthesis

log = logging.getLogger("homeai.wyoming")

READ_TIMEOUT_S = 30.0  # the longest silence inside or between events before the connection is closed
MAX_CHANNELS = 8
LANGUAGE = re.compile(r"^([a-z]{2,3})([-_][A-Za-z0-9]{2,8})?$")  # "en", "en-US": Whisper takes the first part


@dataclass(frozen=True)
class AudioFormat:
    rate: int
    width: int  # bytes per sample
    channels: int

    @classmethod
    def of(cls, event: Event) -> AudioFormat:
        """The format an audio-start or audio-chunk announces, checked."""
        rate, width, channels = (event.data.get(key) for key in ("rate", "width", "channels"))
        for key, value in (("rate", rate), ("width", width), ("channels", channels)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise WyomingError("invalid_value", f"{event.type} needs {key}, an integer, got {value!r}")
        if not MIN_RATE <= rate <= MAX_RATE:
            raise WyomingError("unsupported_audio", f"unsupported sample rate {rate} Hz "
                               f"(accepted: {MIN_RATE}..{MAX_RATE}, best 16000)")
        if width != 2:
            raise WyomingError("unsupported_audio", f"only 16-bit PCM (width 2) is accepted, got width {width}")
        if not 1 <= channels <= MAX_CHANNELS:
            raise WyomingError("unsupported_audio", f"channels must be 1..{MAX_CHANNELS}, got {channels}")
        return cls(rate, width, channels)


class Session:
    """The protocol on one connection: at most one utterance buffered at a time."""

    def __init__(self, service, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.service, self.reader, self.writer = service, reader, writer
        self.cfg = service.cfg
        self.hearing = service.hearing  # speech in
        self.max_bytes = self.cfg.wyoming.max_frame_bytes
        self.max_utterance_s = self.cfg.speech.max_utterance_s
        self.max_audio_bytes = self.cfg.wyoming.max_audio_bytes
        self.language = DEFAULT_LANGUAGE
        self.format: AudioFormat | None = None  # set by audio-start, until audio-stop
        self.pcm = bytearray()  # mono PCM16 at format.rate
        self.handlers = {"describe": self._describe, "ping": self._ping, "transcribe": self._transcribe,
                         "audio-start": self._audio_start, "audio-chunk": self._audio_chunk,
                         "audio-stop": self._audio_stop}
        self.synthesis = Synthesis(service, self.send, writer.close)
        for kind in self.synthesis.handlers:
            self.handlers[kind] = self._synthesis_event

    async def run(self) -> bool:
        """Serve the connection until the client closes it (False) or an error ends it (True: the
        error event was sent, and the client may still be sending the utterance it ended, which the
        caller reads and drops before it closes: `WyomingServer._linger`)."""
        try:
            while True:
                try:
                    event = await self._next_event()
                    if event is None:
                        return False  # the client closed the connection: what it was being told stops
                    handler = self.handlers.get(event.type)
                    if handler is not None:
                        await handler(event)
                except EventRefused as e:
                    await self._error(e.code, e.text)
        except WyomingError as e:
            await self._error(e.code, e.text)
        except ServiceError as e:  # the speech turn's: no speech model, bad audio, a full pool
            await self._error(e.code, e.message)
        except TimeoutError:
            await self._error("timeout", f"nothing received for {READ_TIMEOUT_S:g} s")
        finally:
            self.pcm = bytearray()  # the utterance's buffer goes with the connection, whatever ended it
            await self.synthesis.close()
        return True

    async def _next_event(self) -> Event | None:
        """The next event; TimeoutError once the client is silent for READ_TIMEOUT_S while it is sent
        no speech (a client listening to a long answer says nothing meanwhile)."""
        reading = asyncio.ensure_future(read_event(self.reader, self.max_bytes))
        try:
            while True:
                done, _ = await asyncio.wait({reading}, timeout=READ_TIMEOUT_S)
                if done:
                    return reading.result()
                if not self.synthesis.busy:
                    raise TimeoutError
        finally:
            reading.cancel()

    # ---- events -----------------------------------------------------------------------------

    async def _describe(self, _event: Event) -> None:
        await self.send(describe(self.service))

    async def _ping(self, event: Event) -> None:
        await self.send(Event("pong", {"text": event.data["text"]} if isinstance(event.data.get("text"), str) else {}))

    async def _transcribe(self, event: Event) -> None:
        language = event.data.get("language")
        if language is None:
            self.language = DEFAULT_LANGUAGE
            return
        match = LANGUAGE.match(language) if isinstance(language, str) else None
        if match is None:
            raise WyomingError("invalid_value", f"language must be a code like \"en\", got {language!r}")
        self.language = match.group(1)

    async def _audio_start(self, event: Event) -> None:
        if self.cfg.wyoming.member:  # checked per utterance: `homeai members lanes` applies at once
            await self._allow_voice()
        self.format = AudioFormat.of(event)
        self.pcm.clear()

    async def _audio_chunk(self, event: Event) -> None:
        if self.format is None:
            raise WyomingError("audio_not_started", "audio-chunk before audio-start")
        chunk_format = AudioFormat.of(event)
        if chunk_format != self.format:
            raise WyomingError("audio_format_mismatch", f"an audio-chunk's format {chunk_format} "
                               f"differs from audio-start's {self.format}")
        frame = self.format.width * self.format.channels
        if len(event.payload) % frame:
            raise WyomingError("invalid_audio", f"an audio-chunk holds whole frames of {frame} bytes, "
                               f"got {len(event.payload)} bytes")
        mono = _mono(event.payload, self.format.channels)
        if len(self.pcm) + len(mono) > self.max_audio_bytes:
            raise WyomingError("audio_too_large", f"the utterance is over the {self.max_audio_bytes} bytes "
                               "one connection may buffer (wyoming.max_audio_bytes); it was dropped")
        self.pcm += mono
        if len(self.pcm) > 2 * self.max_utterance_s * self.format.rate:
            raise WyomingError("utterance_too_long", f"the utterance is over the {self.max_utterance_s:g} s "
                               "limit (speech.max_utterance_s)")

    async def _audio_stop(self, _event: Event) -> None:
        if self.format is None:
            raise WyomingError("audio_not_started", "audio-stop before audio-start")
        pcm, rate = bytes(self.pcm), self.format.rate
        self.format = None
        self.pcm.clear()
        if not self.cfg.wyoming.transcript_streaming:
            text, language = await self._text(pcm, rate) if pcm else ("", self.language)
            await self.send(Event("transcript", {"text": text, "language": language}))
            return
        if pcm:
            self.hearing.model()  # no speech model: the error before the stream starts
        await self.send(Event("transcript-start", {"language": self.language}))
        text, language = await self._streamed_text(pcm, rate) if pcm else ("", self.language)
        await self.send(Event("transcript", {"text": text, "language": language}))
        await self.send(Event("transcript-stop"))

    async def _text(self, pcm: bytes, rate: int, on_segment=None) -> tuple[str, str]:
        transcript = await self.hearing.transcribe(pcm, rate, self.language, on_segment=on_segment)
        log.debug("wyoming: transcribed %.1f s of audio in %.0f ms", transcript.duration_s, transcript.elapsed_ms)
        return transcript.text, transcript.language

    async def _streamed_text(self, pcm: bytes, rate: int) -> tuple[str, str]:
        """The transcript, a transcript-chunk sent for each segment as the speech model decodes it
        (the chunks joined are the transcript's text)."""
        loop = asyncio.get_running_loop()
        segments: asyncio.Queue[str | None] = asyncio.Queue()

        def on_segment(text: str) -> None:  # on the speech model's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(segments.put_nowait, text)

        transcription = asyncio.ensure_future(self._text(pcm, rate, on_segment))
        transcription.add_done_callback(lambda _: segments.put_nowait(None))  # after every segment put
        try:
            separator = ""
            while (segment := await segments.get()) is not None:
                await self.send(Event("transcript-chunk", {"text": separator + segment}))
                separator = " "
            return await transcription
        finally:
            transcription.cancel()  # a client gone mid-stream: the result is not waited for

    async def _synthesis_event(self, event: Event) -> None:
        if event.type in ("synthesize", "synthesize-start") and self.cfg.wyoming.member:
            await self._allow_voice()
        await self.synthesis.handlers[event.type](event)

    async def _allow_voice(self) -> None:
        """`wyoming.member`, whom Wyoming clients act as, must exist and may use the voice lane: the
        service's rights, asked of the store now."""
        try:
            await asyncio.to_thread(self.service.member_may_use, self.cfg.wyoming.member, VOICE_LANE)
        except ServiceError as e:
            raise WyomingError(e.code, f"wyoming.member: {e.message}") from None

    # ---- sending ------------------------------------------------------------------------------

    async def send(self, event: Event) -> None:
        self.writer.write(encode(event))
        try:
            await asyncio.wait_for(self.writer.drain(), READ_TIMEOUT_S)
        except TimeoutError:
            raise ConnectionError("the client does not read what it is sent") from None  # dropped

    async def _error(self, code: str, text: str) -> None:
        with contextlib.suppress(ConnectionError):
            await self.send(Event("error", {"text": text, "code": code}))


def _mono(pcm: bytes, channels: int) -> bytes:
    """Interleaved PCM16 frames -> mono PCM16, the channels averaged."""
    if channels == 1:
        return pcm
    frames = np.frombuffer(pcm, dtype="<i2").reshape(-1, channels)
    return frames.mean(axis=1).round().astype("<i2").tobytes()
