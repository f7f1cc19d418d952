"""Bad input on the voice socket: each gets its `error` event and the socket keeps working.

Run: .venv/bin/python -m pytest tests/voice/test_voice_errors.py
"""

from __future__ import annotations

import json

import pytest

from homeai.api.voice_protocol import MAX_MESSAGE_BYTES
from tests.api.conftest import api_config
from tests.voice.conftest import heard, serve, silence, voice_client

pytestmark = [pytest.mark.model, pytest.mark.anyio]

MAX_UTTERANCE_S = 3.0


@pytest.fixture(scope="module")
def cfg(module_tmp):
    # Short answers: these tests are about what comes before them.
    return api_config(module_tmp, speech={"max_utterance_s": MAX_UTTERANCE_S}, lanes={"voice": {"max_tokens": 4}})


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve(cfg, runner, stt) as running:
        yield running


async def answered(client, utterance) -> None:
    events = await client.ask(utterance.raw_16k)
    assert events[-1]["type"] == "response.done", events
    assert heard(next(e for e in events if e["type"] == "transcript.final")["text"])


BEFORE_START = [
    (b"\x00\x01" * 320, "session_not_started"),
    ("{not json", "invalid_json"),
    ("[1, 2]", "invalid_json"),
    ({"type": "session.begin"}, "unknown_type"),
    ({"sample_rate": 16000}, "unknown_type"),
    ({"type": "audio.end"}, "session_not_started"),
    ({"type": "response.cancel"}, "session_not_started"),
    ({"type": "session.start", "sample_rate": 1000}, "unsupported_sample_rate"),
    ({"type": "session.start", "sample_rate": 96000}, "unsupported_sample_rate"),
    ({"type": "session.start"}, "invalid_value"),
    ({"type": "session.start", "sample_rate": "16k"}, "invalid_value"),
    ({"type": "session.start", "sample_rate": 16000, "vad": "yes"}, "invalid_value"),
    ({"type": "session.start", "sample_rate": 16000, "language": "English"}, "invalid_value"),
    ({"type": "session.start", "sample_rate": 16000, "conversation_id": "one"}, "invalid_value"),
    ({"type": "session.start", "sample_rate": 16000, "conversation_id": 987654}, "conversation_not_found"),
]


def frame(message) -> str | bytes:
    return message if isinstance(message, (str, bytes)) else json.dumps(message)


@pytest.mark.parametrize("message,code", BEFORE_START, ids=[code for _, code in BEFORE_START])
async def test_bad_input_before_the_session_starts(server, message, code):
    async with voice_client(server) as client:
        await client.ws.send(frame(message))
        await client.error(code)
        ready = await client.start()  # still usable
        assert ready["sample_rate"] == 16000


async def test_audio_streamed_before_the_session_is_refused_once(server, utterance):
    async with voice_client(server) as client:
        await client.audio(utterance.raw_16k[:64000])  # 100 frames
        await client.error("session_not_started")
        await client.start()  # the very next event: no error per frame


async def test_after_every_bad_input_a_question_is_still_answered(server, utterance):
    async with voice_client(server) as client:
        for message, code in BEFORE_START:
            await client.ws.send(frame(message))
            await client.error(code)
        await client.start()
        await answered(client, utterance)


async def test_odd_length_frame(server, utterance):
    async with voice_client(server) as client:
        await client.start()
        await client.ws.send(b"\x00" * 641)
        await client.error("invalid_audio_frame")
        await answered(client, utterance)  # the odd frame was dropped, not buffered


async def test_oversized_message(server, utterance):
    async with voice_client(server) as client:
        await client.start()
        await client.ws.send(bytes(MAX_MESSAGE_BYTES + 2))
        await client.error("message_too_large")
        await client.ws.send(json.dumps({"type": "session.start", "sample_rate": 16000, "x": "y" * MAX_MESSAGE_BYTES}))
        await client.error("message_too_large")
        await answered(client, utterance)


async def test_audio_end_without_audio(server, utterance):
    async with voice_client(server) as client:
        await client.start()
        await client.send(type="audio.end")
        await client.error("no_audio")
        await answered(client, utterance)


async def test_an_utterance_over_the_limit(server, utterance):
    async with voice_client(server) as client:
        ready = await client.start()
        assert ready["max_utterance_s"] == MAX_UTTERANCE_S
        await client.audio(utterance.raw_16k + silence(MAX_UTTERANCE_S))
        await client.error("utterance_too_long")
        await client.audio(utterance.raw_16k)  # the rest of that utterance is dropped...
        await client.send(type="audio.end")  # ...until it ends, without another event
        await answered(client, utterance)


async def test_silence_is_no_speech(server, utterance):
    async with voice_client(server) as client:
        await client.start(vad=True)
        await client.audio(silence(1.0))
        await client.send(type="audio.end")
        await client.error("no_speech")
        await answered(client, utterance)
