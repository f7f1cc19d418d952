"""The Wyoming service end to end, spoken to with the `wyoming` package's client: describe, real
speech streamed in chunks at 16 kHz and at espeak-ng's own 22050 Hz, empty audio, and each bad
frame answered with an `error` event and a closed connection.

Run: .venv/bin/python -m pytest tests/wyoming/test_wyoming.py
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong

from homeai.wyoming import session
from tests.wyoming.conftest import header, heard, raw_error, read, send_audio, serve, transcribe, wyoming_config

pytestmark = [pytest.mark.model, pytest.mark.anyio]

MAX_UTTERANCE_S = 5.0
MAX_FRAME_BYTES = 65536


@pytest.fixture(scope="module")
def cfg(module_tmp):
    # allow_from holds loopback: the allowed path of the address check runs on every test here.
    return wyoming_config(module_tmp, speech={"max_utterance_s": MAX_UTTERANCE_S},
                          allow_from=["127.0.0.0/8", "::1"], max_frame_bytes=MAX_FRAME_BYTES)


@pytest.fixture(scope="module")
def port(cfg, runner, stt):
    with serve(cfg, runner, stt) as (_server, listening):
        yield listening


async def test_describe_answers_info_with_the_speech_model(port):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        event = await read(client)
    assert event is not None and Info.is_type(event.type), event
    info = Info.from_event(event)
    [program] = info.asr
    assert program.installed and program.name == "homeai" and program.version
    [model] = program.models
    assert model.installed and model.name == "tiny.en" and model.languages == ["en"]


async def test_speech_streamed_in_chunks_is_transcribed(port, utterance):
    text = await transcribe(port, utterance.raw_16k, 16000)
    assert heard(text), text


async def test_speech_at_22050_hz_is_resampled_and_transcribed(port, utterance):
    text = await transcribe(port, utterance.raw_22k, 22050)
    assert heard(text), text


async def test_stereo_is_mixed_down(port, utterance):
    samples = np.frombuffer(utterance.raw_16k, dtype="<i2")
    stereo = np.stack([samples, samples // 2], axis=1)  # the speech on the left, softer on the right
    text = await transcribe(port, stereo.astype("<i2").tobytes(), 16000, channels=2)
    assert heard(text), text


async def test_empty_audio_gives_empty_text(port):
    assert await transcribe(port, b"", 16000) == ""


async def test_one_connection_takes_several_utterances_and_pings(port, utterance):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for pcm in (b"", utterance.raw_16k):
            await send_audio(client, pcm, 16000, language=None)
            event = await read(client)
            assert event.type == "transcript", event
        await client.write_event(Ping(text="hello").event())
        pong = await read(client)
    assert Pong.is_type(pong.type) and Pong.from_event(pong).text == "hello"
    assert heard(event.data["text"]), event


async def test_data_inline_in_the_header_is_accepted(port):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(header(type="audio-start", data={"rate": 16000, "width": 2, "channels": 1})
                     + header(type="audio-stop", version="1.0.0", data={}))
        event = await read(reader)
    finally:
        writer.close()
    assert event.type == "transcript" and event.data["text"] == "", event


async def test_a_header_that_is_not_json_gets_an_error(port):
    error = await raw_error(port, b"this is not json\n")
    assert error.code == "bad_frame" and error.text


@pytest.mark.parametrize("frame", [
    b"[1, 2]\n",  # JSON, not an object
    header(data={}),  # no type
    header(type="describe", data=[1]),
    header(type="describe", data_length=-1),
    header(type="audio-chunk", payload_length="many"),
    header(type="describe", version=1),
])
async def test_a_malformed_header_gets_an_error(port, frame):
    assert (await raw_error(port, frame)).code == "bad_frame"


async def test_a_payload_over_the_limit_gets_an_error(port):
    error = await raw_error(port, header(type="audio-chunk", payload_length=MAX_FRAME_BYTES + 1))
    assert error.code == "frame_too_large" and "wyoming.max_frame_bytes" in error.text


async def test_data_over_the_limit_gets_an_error(port):
    error = await raw_error(port, header(type="transcribe", data_length=10 * MAX_FRAME_BYTES))
    assert error.code == "frame_too_large"


async def test_data_that_is_not_json_gets_an_error(port):
    assert (await raw_error(port, header(type="transcribe", data_length=5) + b"nope!")).code == "bad_frame"


async def test_a_chunk_of_another_format_than_announced_gets_an_error(port):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        await client.write_event(AudioChunk(rate=22050, width=2, channels=1, audio=bytes(2048)).event())
        event = await read(client)
        assert Error.is_type(event.type) and Error.from_event(event).code == "audio_format_mismatch", event
        assert await read(client) is None


@pytest.mark.parametrize("start, code", [
    ({"rate": 16000, "width": 4, "channels": 1}, "unsupported_audio"),
    ({"rate": 4000, "width": 2, "channels": 1}, "unsupported_audio"),
    ({"rate": "16k", "width": 2, "channels": 1}, "invalid_value"),
])
async def test_an_unsupported_audio_start_gets_an_error(port, start, code):
    assert (await raw_error(port, header(type="audio-start", data=start))).code == code


async def test_audio_before_audio_start_gets_an_error(port):
    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=bytes(64)).event()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(chunk)
        event = await read(client)
    assert Error.from_event(event).code == "audio_not_started"


async def test_an_utterance_over_the_limit_gets_an_error(port):
    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=bytes(3200)).event()  # 0.1 s
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for _ in range(int(MAX_UTTERANCE_S * 10) + 1):  # the last chunk goes over: nothing is left unread
            await client.write_event(chunk)
        event = await read(client)
        assert await read(client) is None
    assert Error.is_type(event.type) and Error.from_event(event).code == "utterance_too_long", event


async def test_a_bad_language_gets_an_error(port):
    assert (await raw_error(port, header(type="transcribe", data={"language": "english!"}))).code == "invalid_value"


async def test_a_client_silent_mid_event_is_closed(port, monkeypatch):
    monkeypatch.setattr(session, "READ_TIMEOUT_S", 0.5)
    error = await raw_error(port, b'{"type": "describe"')  # no end of line: the header never ends
    assert error.code == "timeout"
