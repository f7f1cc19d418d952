"""Text to speech on one Wyoming connection: Home Assistant speaking an answer through homeai.

    synthesize {text, voice?: {name}}   -> audio-start {rate, width 2, channels 1}, audio-chunk..., audio-stop
    synthesize-start {voice?}              a stream: the answer's text as it is written
    synthesize-chunk {text} ...         -> each sentence once whole: audio-start, audio-chunk..., audio-stop
    synthesize {text}                      the whole text, sent beside a stream for servers that do not
                                           stream: ignored while streaming
    synthesize-stop                     -> the rest's audio, then synthesize-stopped

A `synthesize` is spoken as one audio stream (what a client that does not stream waits for); a
stream is spoken a sentence at a time (`homeai.speech.sentences`), each its own audio-start..stop,
as wyoming-piper does. A stream is cut once, by the service's `Cutter` (`homeai.service.speaking`,
the one `speak_stream` cuts an answer with), and each sentence is said as it was cut. A thought the
answer opens with (`<think>...</think>`, a thinking model's text handed on whole by a client) is
never said: the cutter's one splitter holds back a thought spanning many chunks and sentences whole,
not only a chunk's own. Speech goes through the service's speech out (`service.speaking`) on
the voice lane: the voice lane's priority on the synthesis pool, the background lanes held while
it is synthesised, and with `wyoming.member` set, that member must be allowed the voice lane and
its share of the pool is that member's (`tts.max_pending_per_member`, with the member's other
clients); without it, Wyoming's clients share one of their own (`ANONYMOUS`).

Texts are spoken in the order asked, one at a time, on a task of the connection's own, so the
connection is still read meanwhile: a stream's text is cut into sentences while earlier ones are
spoken, and a client that closes the connection stops its synthesis at the next chunk.

A refused request gets an `error` event and is dropped; the connection goes on: no text, empty
text, text over `tts.max_chars` or holding a control character or lone surrogate (the field
`text`; in a stream's chunk, the rest of the stream is not spoken), an unknown voice (`voice`),
a chunk or a stop outside a stream; `tts_unavailable`, `model_loading` and `tts_busy` (the
member's cap, or the pool full) as the service says them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from homeai.service.errors import ServiceError
from homeai.service.speaking import Cutter
from homeai.wyoming.framing import Event, EventRefused

log = logging.getLogger("homeai.wyoming")

VOICE_LANE = "voice"  # what Wyoming hears and speaks for: with `wyoming.member` set, that member must be allowed it
SAMPLES_PER_CHUNK = 1024  # per audio-chunk, as wyoming-piper sends them
TEXT = "text"  # the field a text error names
ANONYMOUS = ""  # whom Wyoming's clients are shared as without `wyoming.member`: no member has an empty name
_STOPPED = object()  # queued after a stream's last sentence: synthesize-stopped


@dataclass
class Stream:
    """A streaming synthesis between synthesize-start and synthesize-stop."""

    voice: str
    cutter: Cutter = field(default_factory=Cutter)  # the stream's one: sentences as they complete, no thought
    queued: int = 0  # sentences queued: the first holds background while it is synthesised
    chars: int = 0
    refused: bool = False  # its text went over the cap: the rest is dropped


class Synthesis:
    """The synthesize events of one connection; `send` writes an event to it, `lost` closes it."""

    def __init__(self, service, send, lost):
        self.speaking = service.speaking
        self.max_chars = service.cfg.tts.max_chars
        self.member = service.cfg.wyoming.member or ANONYMOUS  # whose share of the speech-out pool
        self.send, self.lost = send, lost
        self.stream: Stream | None = None
        self.queue: asyncio.Queue = asyncio.Queue()  # (text, voice, whole, first) to speak, or _STOPPED
        self.pending = 0  # queued or being spoken
        self.task: asyncio.Task | None = None
        self.handlers = {"synthesize": self.synthesize, "synthesize-start": self.start,
                         "synthesize-chunk": self.chunk, "synthesize-stop": self.stop}

    @property
    def busy(self) -> bool:
        """Whether there is speech still to send (the client waits in silence meanwhile)."""
        return self.pending > 0

    async def close(self) -> None:
        """The connection is over: what is being spoken stops, what is queued is dropped."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    # ---- events -------------------------------------------------------------------------------

    async def synthesize(self, event: Event) -> None:
        if self.stream is not None:
            return  # the stream's whole text again, for servers that do not stream: spoken already
        text = _text(event)
        voice = self._check(text, _voice(event))
        self._queue((text, voice, True, True))

    async def start(self, event: Event) -> None:
        if self.stream is not None:
            raise EventRefused("synthesize_already_started", "synthesize-start inside a stream "
                               "(synthesize-stop ends the one before); the event was ignored")
        self.stream = Stream(self._check_voice(_voice(event)))

    async def chunk(self, event: Event) -> None:
        stream = self._streaming("synthesize-chunk")
        text = _text(event)
        if stream.refused:
            return
        stream.chars += len(text)
        if stream.chars > self.max_chars:
            stream.refused = True
            raise EventRefused("invalid_value", f"'{TEXT}' is over the {self.max_chars} characters taken "
                               "(tts.max_chars) once the stream's chunks are joined; the rest of the stream "
                               "is not spoken")
        try:
            self.speaking.check_text(text, TEXT)
        except ServiceError as e:
            stream.refused = True
            raise EventRefused(e.code, f"{e.message}; the rest of the stream is not spoken") from None
        for sentence in stream.cutter.feed(text):
            self._queue_sentence(stream, sentence)

    async def stop(self, _event: Event) -> None:
        stream = self._streaming("synthesize-stop")
        self.stream = None
        if not stream.refused:
            for sentence in stream.cutter.finish():
                self._queue_sentence(stream, sentence)
        self._queue(_STOPPED)

    # ---- checks -------------------------------------------------------------------------------

    def _streaming(self, kind: str) -> Stream:
        if self.stream is None:
            raise EventRefused("synthesize_not_started", f"{kind} outside a stream (synthesize-start "
                               "begins one); the event was ignored")
        return self.stream

    def _check(self, text: str, voice: str | None) -> str:
        """The voice to speak `text` with; a refusal naming the field otherwise."""
        try:
            return self.speaking.check(text, voice, 1.0, text_param=TEXT)
        except ServiceError as e:
            raise _refused(e) from None

    def _check_voice(self, voice: str | None) -> str:
        try:
            return self.speaking.voice(voice)
        except ServiceError as e:
            raise _refused(e) from None

    # ---- speaking -----------------------------------------------------------------------------

    def _queue_sentence(self, stream: Stream, sentence: str) -> None:
        self._queue((sentence, stream.voice, False, stream.queued == 0))
        stream.queued += 1

    def _queue(self, item) -> None:
        self.pending += 1
        self.queue.put_nowait(item)
        if self.task is None:
            self.task = asyncio.create_task(self._speak_queued())

    async def _speak_queued(self) -> None:
        try:
            while True:
                item = await self.queue.get()
                try:
                    if item is _STOPPED:
                        await self.send(Event("synthesize-stopped"))
                    else:
                        await self._speak(*item)
                finally:
                    self.pending -= 1
        except ConnectionError:
            self.lost()  # the client does not read: the connection closes, and its reading ends
        except Exception:
            log.exception("wyoming: synthesis failed")
            self.lost()

    async def _speak(self, text: str, voice: str, whole: bool, first: bool) -> None:
        """One audio stream: audio-start, the chunks as they are synthesised, audio-stop. A whole
        text's stream is sent even when nothing in it could be spoken (the client waits for it)."""
        started = False
        try:
            audio = {"rate": self.speaking.sample_rate(voice), "width": 2, "channels": 1}
            if whole:  # a synthesize's text, cut into sentences here
                spoken = self.speaking.speak(text, lane=VOICE_LANE, member=self.member, voice=voice)
            else:  # a stream's sentence, cut already
                spoken = self.speaking.speak_sentence(text, lane=VOICE_LANE, member=self.member, voice=voice,
                                                      first=first)
            async with contextlib.aclosing(spoken):  # a connection lost gives the slot back at once
                async for pcm in spoken:
                    if not started:
                        await self.send(Event("audio-start", audio))
                        started = True
                    for i in range(0, len(pcm), 2 * SAMPLES_PER_CHUNK):
                        await self.send(Event("audio-chunk", audio, pcm[i:i + 2 * SAMPLES_PER_CHUNK]))
        except ServiceError as e:  # the pool full, the voices gone, piper failing on the text
            await self.send(Event("error", {"text": e.message, "code": e.code}))
        else:
            if not started and whole:
                await self.send(Event("audio-start", audio))
                started = True
        if started:
            await self.send(Event("audio-stop"))


def _text(event: Event) -> str:
    text = event.data.get(TEXT)
    if not isinstance(text, str):
        raise EventRefused("invalid_value", f"{event.type} needs {TEXT!r}, a string, got {text!r}; "
                           "the event was ignored")
    return text


def _voice(event: Event) -> str | None:
    """The voice asked for by name (`voice: {name}`); None for the default (a language alone picks nothing)."""
    voice = event.data.get("voice")
    if voice is None:
        return None
    name = voice.get("name") if isinstance(voice, dict) else voice
    if name is not None and not isinstance(name, str):
        raise EventRefused("invalid_value", f"voice.name must be a string, got {name!r}; the event was ignored")
    return name or None


def _refused(error: ServiceError) -> EventRefused:
    text = error.message
    if error.param and f"'{error.param}'" not in text:
        text = f"{text} (field '{error.param}')"
    return EventRefused(error.code or "invalid_request", f"{text}; the event was ignored")
