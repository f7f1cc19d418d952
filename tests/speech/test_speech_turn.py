"""The service's one speech turn (`homeai.service.hearing.Hearing`) over the real speech model: why
there is no model, background held while a spoken question is transcribed, and speech's errors as
the ServiceErrors every protocol sends (the voice socket, Wyoming and transcriptions test them
end to end).

Run: .venv/bin/python -m pytest tests/speech/test_speech_turn.py
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import pytest

from homeai.config import Config, SpeechConfig
from homeai.service.errors import ServiceError
from homeai.service.hearing import Hearing


class Engine:
    """The one engine call a speech turn makes: `background_paused()`, counted while open."""

    def __init__(self):
        self.holds = 0

    @contextlib.contextmanager
    def background_paused(self):
        self.holds += 1
        try:
            yield
        finally:
            self.holds -= 1


def runtime(stt=None, *, engine=None, stt_error=None, pause_background=True):
    cfg = Config(speech=SpeechConfig(pause_background=pause_background))
    return SimpleNamespace(cfg=cfg, stt=stt, stt_error=stt_error, engine=engine)


def refusal(call) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        asyncio.run(call) if asyncio.iscoroutine(call) else call()
    return caught.value


def test_no_model_says_why():
    loading = refusal(Hearing(runtime()).model)
    assert (loading.status, loading.code, loading.headers) == (503, "model_loading", {"Retry-After": "5"})
    failed = refusal(Hearing(runtime(engine=Engine(), stt_error="speech to text is unavailable: no model")).model)
    assert (failed.status, failed.code, failed.message) == (503, "speech_unavailable",
                                                            "speech to text is unavailable: no model")
    assert refusal(Hearing(runtime(engine=Engine())).model).code == "speech_unavailable"


@pytest.mark.parametrize("pause", [True, False])
def test_background_is_held_while_a_question_is_transcribed_as_configured(stt, utterance, pause):
    engine = Engine()
    speech = Hearing(runtime(stt, engine=engine, pause_background=pause))
    stt_call = stt.transcribe_pcm16_async
    held = []

    async def watched(*args):
        held.append(engine.holds)
        return await stt_call(*args)

    stt.transcribe_pcm16_async = watched
    try:
        transcript = asyncio.run(speech.transcribe(utterance.raw_16k, 16000, "en", need_words=True))
    finally:
        del stt.transcribe_pcm16_async
    assert "kitchen" in transcript.text.lower()
    assert held == [1 if pause else 0] and engine.holds == 0


def test_speech_errors_are_service_errors(stt, utterance):
    speech = Hearing(runtime(stt, engine=Engine()))
    odd = refusal(speech.transcribe(b"\x00" * 3, 16000, "en"))
    assert (odd.status, odd.code, odd.param) == (400, "invalid_audio", None)
    not_audio = refusal(speech.transcribe_file(b"not audio at all", None))
    assert (not_audio.status, not_audio.code, not_audio.param) == (400, "invalid_audio", "file")
    silence = bytes(2 * 16000)
    assert asyncio.run(speech.transcribe(silence, 16000, "en", vad=True)).text == ""  # Wyoming's transcript: ""
    nothing = refusal(speech.transcribe(silence, 16000, "en", vad=True, need_words=True))
    assert (nothing.status, nothing.code) == (400, "no_speech")


def test_a_full_pool_is_speech_busy(stt, utterance):
    speech = Hearing(runtime(stt, engine=Engine()))

    async def flood():
        jobs = [speech.transcribe(utterance.raw_16k, 16000, "en") for _ in range(stt.max_pending + 1)]
        return await asyncio.gather(*jobs, return_exceptions=True)

    busy = [r for r in asyncio.run(flood()) if isinstance(r, ServiceError)]
    assert [(r.status, r.code, r.headers) for r in busy] == [(503, "speech_busy", {"Retry-After": "1"})]
