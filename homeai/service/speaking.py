"""Speech out: text in, PCM16 frames out, for every protocol that speaks.

The voice socket (`homeai.api.voice`), Wyoming (`homeai.wyoming`) and `/v1/audio/speech` each
hand text here, whole or as an answer's pieces arrive, with the member it is spoken for (the
service's `Caller.key`; Wyoming's `wyoming.member`). A turn finds the voice (or says why there
is none), checks what it is asked (each refusal a 400 naming its field), takes one slot on the
speech-out pool for the member at its lane's priority (voice before chat before background,
then member share: `homeai.speech.synthesis_queue`), cuts the text into sentences
(`homeai.speech.sentences`) and synthesises each once it is whole. While a voice answer's first
sentence is synthesised the engine's background lanes are held (`tts.pause_background`): the
first audio waits on it, and on a CPU background prefill shares its cores. Leaving the iterator
(a client gone, barge-in) stops synthesis at the next chunk and gives the slot back. Text a
client sends is refused when a synthesiser cannot take it (a control character other than a
tab or line break, a lone surrogate); an answer's own text has those left out instead, since
they are not the listener's doing. A thought a text starts with (`<think>...</think>`, a thinking
model's answer handed on whole by a client) is never said (`homeai.service.thinking.spoken`).
Each error text is written once:

    model_loading       503  the models are still loading (Retry-After 5)
    tts_unavailable     503  no piper or no voice, and why (the load error); chat is unaffected
    invalid_value       400  empty text, text over tts.max_chars, an unknown voice, a speed out of range
    invalid_text        400  a control character or a lone surrogate in the text (naming the field)
    tts_busy            429  the member already has tts.max_pending_per_member syntheses open (Retry-After 1)
    tts_busy            503  the pool has no room for the lane: tts.max_pending, less tts.voice_reserve
                             for all but voice (Retry-After 1)
    synthesis_failed    500  piper failed on the text

    speaking = Speaking(program)   # the service's: `service.speaking`
    voice = speaking.check(text, None, 1.0)
    async for pcm in speaking.speak(text, lane="chat", member=caller.key, voice=voice):  # at sample_rate(voice)
        ...
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

from homeai.service.errors import RETRY_SOON, ServiceError
from homeai.service import thinking, thoughts
from homeai.speech.base import SpeechError, SpeechModelError, SynthesisBusy, SynthesisOverCap, resolve_voice
from homeai.speech.sentences import Sentences, speakable

if TYPE_CHECKING:  # speech out is optional: piper is imported once a voice has loaded
    from homeai.speech.tts import TextToSpeech

LOADING = "text to speech is still loading; retry shortly"
NOT_LOADED = "text to speech is not loaded"
MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's bounds for /v1/audio/speech
PRIORITIES = {"voice": 0, "chat": 1}  # every other lane is background: 2
FIRST_CLAUSE = 24  # an answer's first clause this long is spoken before its sentence ends (`Sentences`)
# What no synthesiser takes: C0 and C1 controls but tab and line breaks (piper's C side ends a text at
# a NUL and fails on it), and lone surrogates (UTF-8 cannot carry them).
UNSAYABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
RETRY_TTS = {"Retry-After": "1"}


def priority(lane: str) -> int:
    """The speech-out pool's priority for a lane's synthesis: voice 0, chat 1, background 2."""
    return PRIORITIES.get(lane, 2)


class Speaking:
    """The speech out of one program (its `tts`, `tts_error`, `engine` and `cfg.tts`)."""

    def __init__(self, program):
        self.program = program

    def model(self) -> TextToSpeech:
        """The loaded voices, or the ServiceError saying why there are none."""
        program = self.program
        if program.tts is not None:
            return program.tts
        if program.tts_error:
            raise ServiceError(503, program.tts_error, code="tts_unavailable")
        if program.engine is None:  # speech out loads with the model
            raise ServiceError(503, LOADING, code="model_loading", headers=RETRY_SOON)
        raise ServiceError(503, NOT_LOADED, code="tts_unavailable")

    def offered(self) -> list[tuple[str, Path]]:
        """(name, .onnx path) of each voice a client may be offered (Wyoming's describe): those loaded,
        or while the models load the one being loaded (read from the config, not loaded); none when
        there is no speech out (disabled, or it failed to load)."""
        program = self.program
        if program.tts is not None:
            return [(voice.name, voice.path) for voice in program.tts.voices.values()]
        cfg = program.cfg.tts
        loading = program.tts_error is None and program.error is None and program.engine is None
        if not (cfg.enabled and loading):
            return []
        try:
            path = resolve_voice(cfg)
        except SpeechError:
            return []
        return [(path.name.removesuffix(".onnx"), path)]

    def voices(self) -> list[str]:
        """The loaded voices' names, the default first."""
        tts = self.model()
        return [tts.default_voice, *sorted(set(tts.voices) - {tts.default_voice})]

    def check(self, text: str, voice: str | None, speed: float, *, text_param: str = "input") -> str:
        """The voice to use for `text` (None: the default), or a 400 naming the field at fault."""
        tts = self.model()
        max_chars = self.program.cfg.tts.max_chars
        if not text or not text.strip():
            raise _invalid(f"'{text_param}' is empty: there is nothing to say", text_param)
        if len(text) > max_chars:
            raise _invalid(f"'{text_param}' is {len(text)} characters long, over the {max_chars} taken "
                           "(tts.max_chars)", text_param)
        self.check_text(text, text_param)
        if not any(ch.isalnum() for ch in speakable(thinking.spoken(text))):
            raise _invalid(f"'{text_param}' has nothing to say once markup and code are left out", text_param)
        name = self.voice(voice)
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise _invalid(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}", "speed")
        return name

    @staticmethod
    def check_text(text: str, text_param: str = "input") -> None:
        """A 400 `invalid_text` naming the field when `text` holds a character no synthesiser takes."""
        found = UNSAYABLE.search(text)
        if found is None:
            return
        ch = found.group()
        what = "a lone surrogate" if "\ud800" <= ch <= "\udfff" else f"the control character U+{ord(ch):04X}"
        raise ServiceError(400, f"'{text_param}' holds {what} at position {found.start()}, which a voice cannot "
                           "say (tab and line breaks are taken)", code="invalid_text", param=text_param)

    def voice(self, voice: str | None) -> str:
        """The loaded voice named (None or "": the default), or a 400 naming "voice"."""
        tts = self.model()
        if voice and voice not in tts.voices:
            raise _invalid(f"unknown voice {voice!r}; the voices are: {', '.join(self.voices())}", "voice")
        return voice or tts.default_voice

    def sample_rate(self, voice: str | None = None) -> int:
        return self.model().sample_rate(voice)

    async def speak(self, text: str, *, lane: str, member: str, voice: str | None = None, speed: float = 1.0,
                    first: bool = True) -> AsyncIterator[bytes]:
        """The whole text, sentence by sentence, PCM16 frames as they come, in one of `member`'s
        slots (`tts_busy` before any frame when there is none). `first=False`: the text goes on an
        answer already being spoken (a Wyoming stream's later sentence): background is not held for it."""
        cutter = Sentences()
        sentences = cutter.feed(thinking.spoken(text)) + cutter.flush()
        spoken = self._sentences_spoken(_listed(sentences), lane, member, voice, speed, hold=first)
        async with contextlib.aclosing(spoken) as frames:
            async for pcm in frames:
                yield pcm

    async def speak_sentence(self, sentence: str, *, lane: str, member: str, voice: str | None = None,
                             first: bool = True) -> AsyncIterator[bytes]:
        """One sentence a `Cutter` gave (a stream's: Wyoming's), said as it is, not cut again, in a
        slot of `member`'s; `first` (the stream's first sentence): background held for it on voice."""
        spoken = self._sentences_spoken(_listed([sentence]), lane, member, voice, 1.0, hold=first)
        async with contextlib.aclosing(spoken) as frames:
            async for pcm in frames:
                yield pcm

    async def speak_stream(self, pieces: AsyncIterator[str], *, lane: str, member: str, voice: str | None = None,
                           speed: float = 1.0) -> AsyncIterator[bytes]:
        """Text arriving (an answer's pieces): each sentence synthesised once it is whole (the first
        clause once it is, `FIRST_CLAUSE`, so the first audio does not wait for a long sentence), all
        in one of `member`'s slots, taken before the first piece is read."""
        spoken = self._sentences_spoken(_cut(pieces), lane, member, voice, speed)
        async with contextlib.aclosing(spoken) as frames:
            async for pcm in frames:
                yield pcm

    async def _sentences_spoken(self, sentences: AsyncIterator[str], lane: str, member: str, voice: str | None,
                                speed: float, hold: bool = True) -> AsyncIterator[bytes]:
        tts = self.model()
        try:
            slot = tts.open(member, priority(lane))
        except SynthesisBusy as e:
            raise _busy(e) from None
        # A voice answer holds background from the start until its first sentence is synthesised:
        # while that sentence is still being written too, so its tokens come at an idle engine's
        # pace. The hold ends with the first sentence: later ones are made while it plays.
        hold_first = contextlib.ExitStack()
        if hold and lane == "voice":
            hold_first.enter_context(self._background_held())
        with slot, hold_first:
            async for sentence in sentences:
                sentence = UNSAYABLE.sub(" ", sentence)  # an answer's stray control character is not said
                if not sentence.strip():
                    continue
                stream = _mapped(slot.stream(sentence, voice=voice, speed=speed))
                async with contextlib.aclosing(stream):
                    async for pcm in stream:
                        yield pcm
                hold_first.close()

    def _background_held(self):
        engine = self.program.engine
        if engine is None or not self.program.cfg.tts.pause_background:
            return contextlib.nullcontext()
        return engine.background_paused()


async def _listed(sentences: list[str]) -> AsyncIterator[str]:
    for sentence in sentences:
        yield sentence


class Cutter:
    """A stream's text as it arrives -> the sentences to say, each once whole: a thought the text
    starts with left out, however many pieces and sentences it spans (one splitter for the whole
    stream), an answer's first clause ahead (`FIRST_CLAUSE`). The one cutter of a stream, for
    `speak_stream` and Wyoming's synthesize-chunk alike."""

    def __init__(self):
        self.sentences = Sentences(first_clause=FIRST_CLAUSE)
        self.thought = thoughts.TagSplitter("<think>", "</think>")  # never said

    def feed(self, piece: str) -> list[str]:
        return self.sentences.feed(self.thought.feed(piece)[1])

    def finish(self) -> list[str]:
        return self.sentences.feed(self.thought.finish()[1]) + self.sentences.flush()


async def _cut(pieces: AsyncIterator[str]) -> AsyncIterator[str]:
    cutter = Cutter()
    async for piece in pieces:
        for sentence in cutter.feed(piece):
            yield sentence
    for sentence in cutter.finish():
        yield sentence


async def _mapped(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A synthesis stream, speech out's failures turned into ServiceErrors; left, it stops the synthesis."""
    try:
        async with contextlib.aclosing(stream):
            async for pcm in stream:
                yield pcm
    except KeyError as e:  # a voice not checked first
        raise _invalid(f"unknown voice {e.args[0]!r}", "voice") from None
    except SynthesisBusy as e:
        raise _busy(e) from None
    except SpeechModelError as e:
        raise ServiceError(500, str(e), code="synthesis_failed") from None


def _busy(e: SynthesisBusy) -> ServiceError:
    """Over the member's own cap: 429, theirs to wait out; the pool full for their lane: 503, the box's."""
    return ServiceError(429 if isinstance(e, SynthesisOverCap) else 503, str(e), code="tts_busy", headers=RETRY_TTS)


def _invalid(message: str, param: str) -> ServiceError:
    return ServiceError(400, message, code="invalid_value", param=param)
