"""Speech in, one turn: audio in, a `Transcript` out, for every protocol that hears speech.

The voice socket (`homeai.api.voice`), Wyoming (`homeai.wyoming.session`) and
`/v1/audio/transcriptions` each take audio their own way and hand it here. A turn finds the
speech model (or says why there is none), holds the engine's background lanes while a spoken
question is transcribed (`speech.pause_background`: on a CPU they share its cores and slow it
several times over), runs on the speech model's bounded pool, and turns speech's failures into
`ServiceError`s, each text written once:

    model_loading       503  the models are still loading (Retry-After 5)
    speech_unavailable  503  no speech model, and why (the load error)
    invalid_audio       400  audio that cannot be transcribed (param "file" for an uploaded file)
    speech_busy         503  the speech model's pool is full (Retry-After 1)
    no_speech           400  nothing was heard, for a caller that needs words (`need_words`)

    hearing = Hearing(program)   # the service's: `service.hearing`
    text = (await hearing.transcribe(pcm, 16000, "en", need_words=True)).text
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from homeai.service.errors import RETRY_SOON, ServiceError
from homeai.speech.base import AudioError, SpeechBusy, Transcript

if TYPE_CHECKING:  # speech is optional: its libraries are imported once a speech model has loaded
    from homeai.speech.stt import EndOfSpeechDetector, SpeechToText

LOADING = "speech to text is still loading; retry shortly"
NOT_LOADED = "speech to text is not loaded"
NO_SPEECH = "no speech was heard in the utterance"


class Hearing:
    """The speech turns of one program (its `stt`, `stt_error`, `engine` and `cfg.speech`)."""

    def __init__(self, program):
        self.program = program

    def model(self) -> SpeechToText:
        """The loaded speech model, or the ServiceError saying why there is none."""
        program = self.program
        if program.stt is not None:
            return program.stt
        if program.stt_error:
            raise ServiceError(503, program.stt_error, code="speech_unavailable")
        if program.engine is None:  # speech loads with the model
            raise ServiceError(503, LOADING, code="model_loading", headers=RETRY_SOON)
        raise ServiceError(503, NOT_LOADED, code="speech_unavailable")

    def max_utterance_s(self) -> float:
        """The longest utterance taken: `speech.max_utterance_s`, and the loaded model's own bound."""
        return min(self.program.cfg.speech.max_utterance_s, self.model().cfg.max_utterance_s)

    def end_of_speech_detector(self) -> EndOfSpeechDetector:
        """A server-side end-of-utterance detector (blocking: it loads the VAD model; call it off the loop)."""
        self.model()
        from homeai.speech.stt import EndOfSpeechDetector  # importable: a speech model has loaded

        return EndOfSpeechDetector()

    async def transcribe(self, pcm16: bytes, sample_rate: int, language: str | None, vad: bool = False, *,
                         need_words: bool = False, on_segment=None) -> Transcript:
        """A spoken question (PCM16 mono at `sample_rate`), background held meanwhile as configured;
        with `need_words`, silence is the error `no_speech`; `on_segment(text)` is called from the
        speech model's thread with each segment as it is decoded (Wyoming's streaming transcripts)."""
        stt = self.model()
        streamed = {"on_segment": on_segment} if on_segment is not None else {}
        with self._background_held():
            transcript = await _mapped(stt.transcribe_pcm16_async(pcm16, sample_rate, language, vad, **streamed))
        if need_words and not transcript.text:
            raise ServiceError(400, NO_SPEECH, code="no_speech")
        return transcript

    async def transcribe_file(self, data: bytes, language: str | None) -> Transcript:
        """An uploaded audio file (anything PyAV decodes); not a spoken question: background goes on."""
        return await _mapped(self.model().transcribe_file_async(data, language), param="file")

    def _background_held(self):
        engine = self.program.engine
        if engine is None or not self.program.cfg.speech.pause_background:
            return contextlib.nullcontext()
        return engine.background_paused()


async def _mapped(transcription, *, param: str | None = None) -> Transcript:
    """Await a transcription, speech's failures turned into ServiceErrors."""
    try:
        return await transcription
    except AudioError as e:
        raise ServiceError(400, str(e), code="invalid_audio", param=param) from None
    except SpeechBusy as e:
        raise ServiceError(503, str(e), code="speech_busy", headers={"Retry-After": "1"}) from None
