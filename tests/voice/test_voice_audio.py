"""The voice socket's spoken answers without a model: `session.start`'s speak and voice checked,
and an answer's audio framed, ended and stopped (`homeai.api.voice_audio`) through the service's
Speaking over a stand-in voice. The real voice, heard back, is tests/voice/test_voice_speak.py.

Run: .venv/bin/python -m pytest tests/voice/test_voice_audio.py
"""

from __future__ import annotations

import asyncio
import time

import pytest

from types import SimpleNamespace

from homeai.api.voice_audio import FRAME_S, SpokenAnswer, Voice, voice_for
from homeai.api.voice_protocol import VoiceError, error_event, parse_settings
from homeai.service import ServiceError, Speaking
from homeai.speech.base import SynthesisBusy

RATE = 22050


class Session:
    """What SpokenAnswer needs of a VoiceSession: `send` (events and frames), `gone` and its `caller`."""

    def __init__(self):
        self.sent: list = []
        self.gone = False
        self.caller = SimpleNamespace(key="carol")

    async def send(self, item) -> None:
        if not self.gone:
            self.sent.append(item)

    def frames(self) -> list[bytes]:
        return [item for item in self.sent if isinstance(item, bytes)]

    def events(self) -> list[str]:
        return [item["type"] for item in self.sent if isinstance(item, dict)]


class Tts:
    """A stand-in for the loaded voice (homeai.speech.tts.TextToSpeech): each sentence is
    `seconds_per_char` of audio a character, in one chunk; with `forever`, a second more each
    10 ms until left; `fail` raises as the pool would when a slot is asked for."""

    def __init__(self, *, seconds_per_char: float = 0.05, forever: bool = False, fail: Exception | None = None):
        self.seconds_per_char, self.forever, self.fail = seconds_per_char, forever, fail
        self.said: list[str] = []
        self.closed = False
        self.slots_open = 0
        self.voices = {"en_US-joe-medium": object()}
        self.default_voice = "en_US-joe-medium"

    def sample_rate(self, voice=None) -> int:
        return RATE

    def open(self, member: str, priority: int = 2):
        assert member == "carol" and priority == 0  # the session's member, on the voice lane
        if self.fail is not None:
            raise self.fail
        self.slots_open += 1
        return self

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.slots_open -= 1

    async def stream(self, text: str, *, voice=None, speed: float = 1.0):
        assert voice == "en_US-joe-medium"
        self.said.append(text)
        try:
            yield bytes(2 * round(RATE * self.seconds_per_char * len(text)))
            while self.forever:
                await asyncio.sleep(0.01)
                yield bytes(2 * RATE)
        finally:
            self.closed = True


def speaking_with(tts: Tts | None, tts_error: str | None = None) -> Speaking:
    """The service's real Speaking over a runtime holding `tts` (no engine: nothing to hold)."""
    cfg = SimpleNamespace(tts=SimpleNamespace(pause_background=True, max_chars=4000))
    return Speaking(SimpleNamespace(tts=tts, tts_error=tts_error, engine=None, cfg=cfg))


def answer(session, tts: Tts) -> SpokenAnswer:
    return SpokenAnswer(session, speaking_with(tts), Voice("en_US-joe-medium", RATE), "voice", time.perf_counter())


@pytest.mark.anyio
async def test_an_answer_is_spoken_in_frames_between_start_and_done():
    session, tts = Session(), Tts()
    audio = answer(session, tts)
    await audio.begin()
    for piece in ("The kitchen **light** ", "is on. Any", "thing else?"):
        audio.say(piece)
    await audio.finish()
    await audio.close()
    assert session.sent[0] == {"type": "response.audio.start", "sample_rate": RATE}
    assert session.sent[-1] == {"type": "response.audio.done"}
    assert tts.said == ["The kitchen light is on.", "Anything else?"] and tts.closed  # by sentence, no markup
    frames = session.frames()
    assert sum(map(len, frames)) == sum(2 * round(RATE * 0.05 * len(p)) for p in tts.said)
    assert all(len(f) % 2 == 0 and len(f) <= 2 * round(FRAME_S * RATE) for f in frames)
    assert len(frames) > 3 and audio.first_audio_ms is not None and audio.first_audio_ms >= 0


@pytest.mark.anyio
async def test_stop_sends_no_frame_after_it_and_closes_synthesis():
    session, tts = Session(), Tts(forever=True)
    audio = answer(session, tts)
    await audio.begin()
    audio.say("Counting sheep. One")  # a sentence is whole once the next begins
    while len(session.frames()) < 10:
        await asyncio.sleep(0.01)
    await audio.stop()
    count = len(session.frames())
    await asyncio.sleep(0.1)
    assert len(session.frames()) == count and tts.closed and tts.slots_open == 0  # the slot given back
    await audio.close()
    assert session.events() == ["response.audio.start", "response.audio.done"]
    await audio.close()  # once only
    assert session.events() == ["response.audio.start", "response.audio.done"]


@pytest.mark.anyio
async def test_a_client_that_leaves_stops_synthesis():
    session, tts = Session(), Tts(forever=True)
    audio = answer(session, tts)
    await audio.begin()
    audio.say("Counting sheep. One")  # a sentence is whole once the next begins
    while not session.frames():
        await asyncio.sleep(0.01)
    session.gone = True
    await asyncio.wait_for(audio.task, 5)
    assert tts.closed and tts.slots_open == 0


@pytest.mark.anyio
async def test_a_synthesis_failure_ends_the_audio_with_its_error():
    session, tts = Session(), Tts(fail=SynthesisBusy("speech synthesis is busy"))
    audio = answer(session, tts)
    await audio.begin()
    audio.say("Hello there.")
    await audio.finish()
    await audio.close()
    assert session.sent[-1] == {"type": "response.audio.done",
                                "error": {"code": "tts_busy", "message": "speech synthesis is busy"}}
    assert not session.frames() and audio.first_audio_ms is None


def settings(**fields):
    return parse_settings({"type": "session.start", "sample_rate": 16000, **fields})


def test_speak_and_voice_are_checked_at_session_start():
    speaking = speaking_with(Tts())
    assert voice_for(speaking, settings()) is None  # not asked: synthesis is never needed
    assert voice_for(speaking, settings(speak=True)) == Voice("en_US-joe-medium", RATE)
    assert voice_for(speaking, settings(speak=True, voice="en_US-joe-medium")).name == "en_US-joe-medium"
    with pytest.raises(ServiceError) as e:
        voice_for(speaking, settings(speak=True, voice="en_GB-nobody"))
    assert e.value.param == "voice" and "en_US-joe-medium" in e.value.message
    assert error_event(e.value)["param"] == "voice"
    for bad in ({"speak": "yes"}, {"speak": 1}, {"voice": 3}, {"voice": " "}):
        with pytest.raises(VoiceError) as e:
            settings(**bad)
        assert e.value.code == "invalid_value" and e.value.param == next(iter(bad))


def test_speaking_without_synthesis_is_refused_with_why():
    unavailable = speaking_with(None, "text to speech is unavailable: no module named 'piper'")
    with pytest.raises(ServiceError) as e:
        voice_for(unavailable, settings(speak=True))
    assert e.value.code == "tts_unavailable" and "piper" in e.value.message
    assert voice_for(unavailable, settings(speak=False)) is None
