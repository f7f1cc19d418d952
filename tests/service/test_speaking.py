"""The service's speech out (`homeai.service.speaking`) with the real piper voice: checks naming the
field, speaking heard back, sentences spoken while the answer still arrives, the background held
only while a voice answer's first sentence is synthesised, leaving stopping the synthesis.

The runtime is a plain namespace holding the real voice; its engine records only the background
holds (the real engine's hold is tested in tests/engine). Run:
.venv/bin/python -m pytest tests/service/test_speaking.py
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import pytest

from homeai.config import Config, TtsConfig
from homeai.service import ServiceError, Speaking
from tests.conftest import heard_share

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture
def anyio_backend():
    return "asyncio"


class HoldingEngine:
    """Counts the background holds open, as `Engine.background_paused` does."""

    def __init__(self):
        self.holds = 0
        self.num_held = 0

    @contextlib.contextmanager
    def background_paused(self):
        self.holds += 1
        self.num_held += 1
        try:
            yield
        finally:
            self.holds -= 1


def runtime(tts, **tts_cfg):
    return SimpleNamespace(tts=tts, tts_error=None, engine=HoldingEngine(), cfg=Config(tts=TtsConfig(**tts_cfg)))


async def pieces_of(text: str, consumed: list[int]):
    """An answer's text arriving token by token (here: a word at a time), counting what was taken."""
    for i, word in enumerate(text.split(" ")):
        consumed.append(i)
        yield word if i == 0 else " " + word


# ---- what is refused -----------------------------------------------------------------------

def test_check_names_the_field_at_fault(tts):
    speaking = Speaking(runtime(tts, max_chars=40))
    assert speaking.check("Hello there.", None, 1.0) == "en_US-joe-medium"
    assert speaking.check("Hello there.", "en_US-joe-medium", 0.25) == "en_US-joe-medium"
    cases = [(("", None, 1.0), "input", "empty"), ((" \n", None, 1.0), "input", "empty"),
             (("x" * 41, None, 1.0), "input", "40"), (("```\ncode\n```", None, 1.0), "input", "nothing to say"),
             (("Hello.", "nobody", 1.0), "voice", "en_US-joe-medium"), (("Hello.", None, 4.5), "speed", "4.0"),
             (("Hello.", None, 0.1), "speed", "0.25")]
    for args, param, said in cases:
        with pytest.raises(ServiceError) as caught:
            speaking.check(*args)
        assert (caught.value.status, caught.value.param) == (400, param), args
        assert said in caught.value.message, caught.value.message
    with pytest.raises(ServiceError) as caught:
        speaking.check("", None, 1.0, text_param="text")
    assert caught.value.param == "text"


def test_no_voice_says_why(tts):
    loading = SimpleNamespace(tts=None, tts_error=None, engine=None, cfg=Config())
    with pytest.raises(ServiceError) as caught:
        Speaking(loading).model()
    assert caught.value.code == "model_loading" and caught.value.status == 503
    failed = SimpleNamespace(tts=None, tts_error="text to speech is unavailable: no piper (test)", engine=object(),
                             cfg=Config())
    with pytest.raises(ServiceError) as caught:
        Speaking(failed).check("Hello.", None, 1.0)
    assert caught.value.code == "tts_unavailable" and "no piper (test)" in caught.value.message


# ---- speaking ------------------------------------------------------------------------------

async def test_speak_is_heard_back(tts, stt):
    text = "**Dinner** is ready. Please come to the table!"
    frames = [pcm async for pcm in Speaking(runtime(tts)).speak(text, lane="chat", member="alice")]
    assert len(frames) == 2  # a sentence each
    share, heard = heard_share(stt, b"".join(frames), tts.sample_rate(), "dinner is ready please come to the table")
    assert share >= 0.7, heard


async def test_speak_stream_speaks_the_first_sentence_before_the_answer_ends(tts, stt):
    text = "The weather is fine today. Tomorrow it will rain in the afternoon, so take an umbrella with you."
    consumed: list[int] = []
    speaking = Speaking(runtime(tts))
    frames = speaking.speak_stream(pieces_of(text, consumed), lane="voice", member="alice")
    first = await anext(frames)
    assert len(consumed) < len(text.split(" "))  # the rest of the answer has not even arrived
    rest = [pcm async for pcm in frames]
    share, heard = heard_share(stt, b"".join([first, *rest]), tts.sample_rate(), text)
    assert share >= 0.7, heard


async def test_background_is_held_only_for_a_voice_answers_first_sentence(tts):
    text = "First sentence here. Second sentence here. Third one."
    rt = runtime(tts)
    held_at_frames = [rt.engine.holds async for _ in Speaking(rt).speak(text, lane="voice", member="alice")]
    assert held_at_frames == [1, 0, 0] and rt.engine.num_held == 1 and rt.engine.holds == 0
    rt = runtime(tts)
    assert [rt.engine.holds async for _ in Speaking(rt).speak(text, lane="chat", member="alice")] == [0, 0, 0]
    assert rt.engine.num_held == 0
    rt = runtime(tts, pause_background=False)
    assert [rt.engine.holds async for _ in Speaking(rt).speak(text, lane="voice", member="alice")] == [0, 0, 0]
    rt = runtime(tts)  # a later sentence of an answer already being spoken (Wyoming's streams)
    held_at_frames = [rt.engine.holds async for _ in Speaking(rt).speak(text, lane="voice", member="alice", first=False)]
    assert held_at_frames == [0, 0, 0]
    assert rt.engine.num_held == 0


async def test_leaving_stops_the_synthesis_and_the_hold(tts, monkeypatch):
    made = []
    synthesize = tts.synthesize

    def counted(text, **kwargs):
        for chunk in synthesize(text, **kwargs):
            made.append(text)
            yield chunk

    monkeypatch.setattr(tts, "synthesize", counted)
    rt = runtime(tts)
    text = " ".join(f"Sentence {n} of many." for n in range(12))
    async with contextlib.aclosing(Speaking(rt).speak(text, lane="voice", member="alice")) as frames:
        async for _ in frames:
            break
    assert rt.engine.holds == 0
    for _ in range(3000):
        if tts.num_pending == 0:
            break
        await asyncio.sleep(0.02)
    assert tts.num_pending == 0 and len(made) <= 2, made


async def test_a_full_pool_is_503_tts_busy(tts, monkeypatch):
    monkeypatch.setattr(tts.admission, "max_pending", tts.admission.voice_reserve)  # room for voice alone
    with pytest.raises(ServiceError) as caught:
        await anext(Speaking(runtime(tts)).speak("Hello.", lane="chat", member="alice"))
    assert (caught.value.status, caught.value.code) == (503, "tts_busy")
    assert caught.value.headers == {"Retry-After": "1"} and "tts.max_pending" in caught.value.message
    assert [pcm async for pcm in Speaking(runtime(tts)).speak("Hello.", lane="voice", member="alice")]
    assert tts.num_pending == 0


async def test_a_member_at_their_cap_is_429_tts_busy_naming_it(tts):
    cap = tts.admission.max_pending_per_member
    slots = [tts.open("alice", 1) for _ in range(cap)]
    try:
        for spoken in (Speaking(runtime(tts)).speak("Hello.", lane="chat", member="alice"),
                       Speaking(runtime(tts)).speak_stream(pieces_of("Hello there.", []), lane="voice",
                                                           member="alice")):
            with pytest.raises(ServiceError) as caught:
                await anext(spoken)
            assert (caught.value.status, caught.value.code) == (429, "tts_busy")
            assert f"tts.max_pending_per_member = {cap}" in caught.value.message
            assert caught.value.headers == {"Retry-After": "1"}
        assert [pcm async for pcm in Speaking(runtime(tts)).speak("Hello.", lane="chat", member="bob")]
    finally:
        for slot in slots:
            slot.close()
    assert tts.num_pending == 0


async def test_an_answers_control_characters_are_left_out_not_said(tts, stt):
    """Text a client sends is refused for them (`check_text`); an answer's own is not the listener's doing."""
    consumed: list[int] = []
    text = "The garage\x00 door is\x1b closed now."
    frames = [pcm async for pcm in Speaking(runtime(tts)).speak_stream(pieces_of(text, consumed), lane="voice",
                                                                         member="alice")]
    share, heard = heard_share(stt, b"".join(frames), tts.sample_rate(), "the garage door is closed now")
    assert share >= 0.7, heard


@pytest.mark.parametrize("text, what", [("Hello\x00 there.", "U+0000"), ("Bell\x07.", "U+0007"),
                                        ("Esc\x1b[0m.", "U+001B"), ("C1\x85 next.", "U+0085"),
                                        ("Half \ud83d a face.", "lone surrogate")])
def test_text_no_synthesiser_takes_is_400_naming_the_field(tts, text, what):
    speaking = Speaking(runtime(tts))
    for param in ("input", "text"):
        with pytest.raises(ServiceError) as caught:
            speaking.check(text, None, 1.0, text_param=param)
        assert (caught.value.status, caught.value.code, caught.value.param) == (400, "invalid_text", param)
        assert what in caught.value.message and f"'{param}'" in caught.value.message
    assert speaking.check("Tabs\tand\nline\r\nbreaks are fine.", None, 1.0) == tts.default_voice


async def test_a_voice_answer_holds_background_while_its_first_sentence_is_still_written(tts):
    rt = runtime(tts)
    holds_while_written = []

    async def answer():
        for word in "The kitchen lights are on now. All of them.".split(" "):
            holds_while_written.append(rt.engine.holds)
            yield word + " "

    held_at_frames = [rt.engine.holds async for _ in Speaking(rt).speak_stream(answer(), lane="voice", member="alice")]
    assert holds_while_written[:6] == [1] * 6  # the first sentence's words come while background is held
    assert held_at_frames[0] == 1 and held_at_frames[-1] == 0 and rt.engine.holds == 0 and rt.engine.num_held == 1
