"""Speech out: text in, PCM16 frames out, for every protocol that speaks.

The voice socket (`homeai.api.voice`), Wyoming (`homeai.wyoming`) and `/v1/audio/speech` each
hand text here, whole or as an answer's pieces arrive. A turn finds the voice (or says why there
is none), checks what it is asked (each refusal a 400 naming its field), cuts the text into
sentences (`homeai.speech.sentences`) and synthesises each once it is whole, on the speech-out
pool at its lane's priority (voice before chat before background). While a voice answer's first
sentence is synthesised the engine's background lanes are held (`tts.pause_background`): the
first audio waits on it, and on a CPU background prefill shares its cores. Leaving the iterator
(a client gone, barge-in) stops synthesis at the next chunk. Each error text is written once:

    model_loading       503  the models are still loading (Retry-After 5)
    tts_unavailable     503  no piper or no voice, and why (the load error); chat is unaffected
    invalid_value       400  empty text, text over tts.max_chars, an unknown voice, a speed out of range
    tts_busy            503  the speech-out pool is full (Retry-After 1)
    synthesis_failed    500  piper failed on the text

    speaking = Speaking(runtime)
    voice = speaking.check(text, None, 1.0)
    async for pcm in speaking.speak(text, lane="chat", voice=voice):  # at speaking.sample_rate(voice)
        ...
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, AsyncIterator

from homeai.service.errors import RETRY_SOON, ServiceError
from homeai.speech.base import SpeechModelError, SynthesisBusy
from homeai.speech.sentences import Sentences, speakable

if TYPE_CHECKING:  # speech out is optional: piper is imported once a voice has loaded
    from homeai.speech.tts import TextToSpeech

LOADING = "text to speech is still loading; retry shortly"
NOT_LOADED = "text to speech is not loaded"
MIN_SPEED, MAX_SPEED = 0.25, 4.0  # OpenAI's bounds for /v1/audio/speech
PRIORITIES = {"voice": 0, "chat": 1}  # every other lane is background: 2
FIRST_CLAUSE = 24  # an answer's first clause this long is spoken before its sentence ends (`Sentences`)


def priority(lane: str) -> int:
    """The speech-out pool's priority for a lane's synthesis: voice 0, chat 1, background 2."""
    return PRIORITIES.get(lane, 2)


class Speaking:
    """The speech out of one runtime (its `tts`, `tts_error`, `engine` and `cfg.tts`)."""

    def __init__(self, runtime):
        self.runtime = runtime

    def model(self) -> TextToSpeech:
        """The loaded voices, or the ServiceError saying why there are none."""
        runtime = self.runtime
        if runtime.tts is not None:
            return runtime.tts
        if runtime.tts_error:
            raise ServiceError(503, runtime.tts_error, code="tts_unavailable")
        if runtime.engine is None:  # speech out loads with the model
            raise ServiceError(503, LOADING, code="model_loading", headers=RETRY_SOON)
        raise ServiceError(503, NOT_LOADED, code="tts_unavailable")

    def voices(self) -> list[str]:
        """The loaded voices' names, the default first."""
        tts = self.model()
        return [tts.default_voice, *sorted(set(tts.voices) - {tts.default_voice})]

    def check(self, text: str, voice: str | None, speed: float, *, text_param: str = "input") -> str:
        """The voice to use for `text` (None: the default), or a 400 naming the field at fault."""
        tts = self.model()
        max_chars = self.runtime.cfg.tts.max_chars
        if not text or not text.strip():
            raise _invalid(f"'{text_param}' is empty: there is nothing to say", text_param)
        if len(text) > max_chars:
            raise _invalid(f"'{text_param}' is {len(text)} characters long, over the {max_chars} taken "
                           "(tts.max_chars)", text_param)
        if not any(ch.isalnum() for ch in speakable(text)):
            raise _invalid(f"'{text_param}' has nothing to say once markup and code are left out", text_param)
        name = self.voice(voice)
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise _invalid(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}", "speed")
        return name

    def voice(self, voice: str | None) -> str:
        """The loaded voice named (None or "": the default), or a 400 naming "voice"."""
        tts = self.model()
        if voice and voice not in tts.voices:
            raise _invalid(f"unknown voice {voice!r}; the voices are: {', '.join(self.voices())}", "voice")
        return voice or tts.default_voice

    def sample_rate(self, voice: str | None = None) -> int:
        return self.model().sample_rate(voice)

    async def speak(self, text: str, *, lane: str, voice: str | None = None, speed: float = 1.0,
                    first: bool = True) -> AsyncIterator[bytes]:
        """The whole text, sentence by sentence, PCM16 frames as they come. `first=False`: the text
        goes on an answer already being spoken (a Wyoming stream's later sentence): background is
        not held for it."""
        cutter = Sentences()
        sentences = cutter.feed(text) + cutter.flush()
        spoken = self._sentences_spoken(_listed(sentences), lane, voice, speed, hold=first)
        async with contextlib.aclosing(spoken) as frames:
            async for pcm in frames:
                yield pcm

    async def speak_stream(self, pieces: AsyncIterator[str], *, lane: str, voice: str | None = None,
                           speed: float = 1.0) -> AsyncIterator[bytes]:
        """Text arriving (an answer's pieces): each sentence synthesised once it is whole (the first
        clause once it is, `FIRST_CLAUSE`, so the first audio does not wait for a long sentence)."""
        async with contextlib.aclosing(self._sentences_spoken(_cut(pieces), lane, voice, speed)) as frames:
            async for pcm in frames:
                yield pcm

    async def _sentences_spoken(self, sentences: AsyncIterator[str], lane: str, voice: str | None,
                                speed: float, hold: bool = True) -> AsyncIterator[bytes]:
        tts = self.model()
        # A voice answer holds background from the start until its first sentence is synthesised:
        # while that sentence is still being written too, so its tokens come at an idle engine's
        # pace. The hold ends with the first sentence: later ones are made while it plays.
        hold_first = contextlib.ExitStack()
        if hold and lane == "voice":
            hold_first.enter_context(self._background_held())
        with hold_first:
            async for sentence in sentences:
                stream = _mapped(tts.stream(sentence, voice=voice, speed=speed, priority=priority(lane)))
                async with contextlib.aclosing(stream):
                    async for pcm in stream:
                        yield pcm
                hold_first.close()

    def _background_held(self):
        engine = self.runtime.engine
        if engine is None or not self.runtime.cfg.tts.pause_background:
            return contextlib.nullcontext()
        return engine.background_paused()


async def _listed(sentences: list[str]) -> AsyncIterator[str]:
    for sentence in sentences:
        yield sentence


async def _cut(pieces: AsyncIterator[str]) -> AsyncIterator[str]:
    cutter = Sentences(first_clause=FIRST_CLAUSE)
    async for piece in pieces:
        for sentence in cutter.feed(piece):
            yield sentence
    for sentence in cutter.flush():
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
        raise ServiceError(503, str(e), code="tts_busy", headers={"Retry-After": "1"}) from None
    except SpeechModelError as e:
        raise ServiceError(500, str(e), code="synthesis_failed") from None


def _invalid(message: str, param: str) -> ServiceError:
    return ServiceError(400, message, code="invalid_value", param=param)
