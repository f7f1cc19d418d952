"""Spoken answers on the voice socket, with real audio both ways: a question spoken by espeak-ng,
answered by the model, the answer spoken by piper in frames, and heard back by faster-whisper
with most of the answer's words. Cancel, barge-in and a client that leaves stop the frames and
the synthesis; an unknown voice is refused naming the field.

Run: .venv/bin/python -m pytest tests/voice/test_voice_speak.py
"""

from __future__ import annotations

import asyncio
import json

import pytest

from homeai.api import voice_turn
from homeai.api.voice_audio import FRAME_S
from homeai.service import SamplingAsk
from homeai.speech.sentences import speakable
from tests.api.conftest import TIMEOUT, api_config
from tests.api.conftest import serve as api_serve
from tests.conftest import heard_share
from tests.voice.conftest import heard, poll, voice_client, voice_idle

pytestmark = [pytest.mark.model, pytest.mark.anyio]

MIN_HEARD = 0.7  # of the answer's words, heard back (speech recognition spells some its own way)


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, lanes={"voice": {"max_tokens": 48}})


@pytest.fixture(scope="module")
def server(cfg, runner, stt, tts):
    with api_serve(cfg, runner, stt=stt, tts=tts) as running:
        yield running


@pytest.fixture
def endless_answers(monkeypatch):
    """Answers that cannot end on their own before a cancel: no end-of-generation, 4000 tokens."""
    monkeypatch.setattr(voice_turn, "answer_sampling", lambda policy: SamplingAsk(max_tokens=4000, ignore_eos=True))


async def listen(client, *types: str) -> list:
    """Messages up to and including the first event of one of `types`: events as dicts, frames as bytes."""
    messages = []
    while not messages or isinstance(messages[-1], bytes) or messages[-1]["type"] not in types:
        message = await asyncio.wait_for(client.ws.recv(), TIMEOUT)
        messages.append(message if isinstance(message, bytes) else json.loads(message))
    return messages


def kinds(messages: list) -> list[str]:
    return ["frame" if isinstance(m, bytes) else m["type"] for m in messages]


async def speak_question(client, utterance) -> None:
    await client.audio(utterance.raw_16k)
    await client.send(type="audio.end")


async def nothing_more(client, seconds: float = 1.0) -> bool:
    try:
        await asyncio.wait_for(client.ws.recv(), seconds)
    except asyncio.TimeoutError:
        return True
    return False


async def test_a_spoken_question_is_answered_in_speech_heard_back(server, utterance, stt, tts):
    async with voice_client(server) as client:
        ready = await client.start(speak=True)
        rate = tts.sample_rate()
        assert ready["speak"] is True and ready["voice"] == tts.default_voice and ready["audio_sample_rate"] == rate
        await speak_question(client, utterance)
        messages = await listen(client, "response.done", "error")
        order = kinds(messages)
        assert order[0] == "transcript.final" and heard(messages[0]["text"])
        assert order[1] == "response.audio.start" and messages[1]["sample_rate"] == rate
        assert order[-2:] == ["response.audio.done", "response.done"] and "error" not in messages[-2]
        frames = [m for m in messages if isinstance(m, bytes)]
        assert frames and all(0 < len(f) <= 2 * round(FRAME_S * rate) and len(f) % 2 == 0 for f in frames)
        done = messages[-1]
        assert done["finish_reason"] in ("stop", "length")
        deltas = [m["text"] for m in messages if not isinstance(m, bytes) and m["type"] == "response.delta"]
        assert deltas and "".join(deltas) == done["text"]
        timings = done["timings"]
        assert timings["stt_ms"] <= timings["first_audio_ms"] <= timings["total_ms"]
        said = speakable(done["text"])
        share, heard_text = heard_share(stt, b"".join(frames), rate, said)
        assert share >= MIN_HEARD, (said, heard_text)
        # The socket speaks the next answer too.
        await speak_question(client, utterance)
        assert kinds(await listen(client, "response.done", "error"))[-2:] == ["response.audio.done", "response.done"]
    assert await poll(lambda: voice_idle(server) and tts.num_pending == 0)


async def test_cancel_stops_the_frames_and_the_synthesis(server, utterance, tts, endless_answers):
    async with voice_client(server) as client:
        await client.start(speak=True)
        await speak_question(client, utterance)
        await first_frame(client)
        await client.send(type="response.cancel")
        messages = await listen(client, "response.done")
        order = kinds(messages)
        assert order[-2:] == ["response.audio.done", "response.done"]  # no frame after the audio's end
        assert messages[-1]["finish_reason"] == "cancelled" and messages[-1]["timings"]["first_audio_ms"] is not None
        assert await nothing_more(client)
        assert await poll(lambda: voice_idle(server) and tts.num_pending == 0)


async def first_frame(client) -> bool:
    """Read on until the answer's first audio frame."""
    while not isinstance(await asyncio.wait_for(client.ws.recv(), TIMEOUT), bytes):
        pass
    return True


async def test_barge_in_stops_the_spoken_answer(server, utterance, tts, endless_answers):
    async with voice_client(server) as client:
        await client.start(speak=True)
        await speak_question(client, utterance)
        await first_frame(client)
        await client.audio(utterance.raw_16k[:6400])  # the member speaks over the answer
        messages = await listen(client, "response.done")
        assert kinds(messages)[-2:] == ["response.audio.done", "response.done"]
        assert messages[-1]["finish_reason"] == "interrupted"
        assert await nothing_more(client)
        assert await poll(lambda: voice_idle(server) and tts.num_pending == 0)


async def test_a_client_that_leaves_stops_the_synthesis(server, utterance, tts, endless_answers):
    async with voice_client(server) as client:
        await client.start(speak=True)
        await speak_question(client, utterance)
        await first_frame(client)
    assert await poll(lambda: voice_idle(server) and tts.num_pending == 0)


async def test_a_member_at_their_speech_cap_gets_the_written_answer_and_audio_done_saying_why(server, utterance,
                                                                                               tts):
    """The member's share of the speech-out pool is taken (their read-alouds elsewhere): the answer
    is written as ever, and `response.audio.done` carries `tts_busy` naming the cap."""
    cap = tts.admission.max_pending_per_member
    async with voice_client(server) as client:
        member = (await client.start(speak=True))["member"]
        slots = [tts.open(member, 1) for _ in range(cap)]
        try:
            await speak_question(client, utterance)
            messages = await listen(client, "response.done", "error")
        finally:
            for slot in slots:
                slot.close()
    assert kinds(messages)[-2:] == ["response.audio.done", "response.done"] and "frame" not in kinds(messages)
    error = messages[-2]["error"]
    assert error["code"] == "tts_busy" and f"tts.max_pending_per_member = {cap}" in error["message"], error
    assert messages[-1]["text"]  # the written answer is unaffected
    assert await poll(lambda: voice_idle(server) and tts.num_pending == 0)


async def test_an_unknown_voice_is_refused_naming_the_field(server, tts):
    async with voice_client(server) as client:
        await client.send(type="session.start", sample_rate=16000, speak=True, voice="en_GB-nobody-low")
        error = await client.error("invalid_value")
        assert error["param"] == "voice" and tts.default_voice in error["message"]
        await client.send(type="session.start", sample_rate=16000, speak="yes")
        assert (await client.error("invalid_value"))["param"] == "speak"
        ready = await client.start(speak=True, voice=tts.default_voice)  # the socket goes on
        assert ready["voice"] == tts.default_voice
