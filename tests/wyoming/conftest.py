"""Fixtures for the Wyoming tests: real speech (espeak-ng and sox), one speech model per session,
a real daemon over the shared model (and the shared piper voice, tests/conftest.py's `tts`) with its
Wyoming listener on a free loopback port, and helpers that speak to it with the `wyoming` package's
own client and event reader.

Only one engine may drive the runner at a time: each module starts at most one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event

from tests.api.conftest import TIMEOUT, api_config
from tests.api.conftest import serve as api_serve
from tests.speech.conftest import Utterance, synthesise

SENTENCE = "turn on the kitchen lights"
CHUNK_SAMPLES = 1024  # what Home Assistant's satellites send per audio-chunk


@pytest.fixture(scope="session")
def utterance(tmp_path_factory) -> Utterance:
    return synthesise(SENTENCE, tmp_path_factory.mktemp("wyoming"))


def wyoming_config(tmp_dir, speech=None, **wyoming):
    """A test config with the Wyoming listener on, on any free loopback port."""
    sections = {"speech": speech} if speech else {}
    return api_config(tmp_dir, wyoming={"enabled": True, "port": 0, **wyoming}, **sections)


@contextlib.contextmanager
def serve(cfg, runner, stt, tts=None):
    """The api tests' daemon with a loaded speech model (and voice); yields (server, Wyoming port)."""
    with api_serve(cfg, runner, stt=stt, tts=tts) as server:
        yield server, server.app.state.wyoming.port


def heard(text: str) -> bool:
    return "kitchen" in text.lower() or "light" in text.lower()


async def read(client_or_reader) -> Event | None:
    """The next event from a wyoming client or a raw stream reader; None once the server has closed."""
    if isinstance(client_or_reader, asyncio.StreamReader):
        return await asyncio.wait_for(async_read_event(client_or_reader), TIMEOUT)
    return await asyncio.wait_for(client_or_reader.read_event(), TIMEOUT)


async def send_audio(client: AsyncTcpClient, pcm: bytes, rate: int, *, language: str | None = "en",
                     channels: int = 1) -> None:
    """transcribe, audio-start, the audio in chunks, audio-stop: what Home Assistant sends per turn."""
    await client.write_event(Transcribe(language=language).event())
    await client.write_event(AudioStart(rate=rate, width=2, channels=channels).event())
    step = 2 * channels * CHUNK_SAMPLES
    for i in range(0, len(pcm), step):
        await client.write_event(AudioChunk(rate=rate, width=2, channels=channels, audio=pcm[i:i + step]).event())
    await client.write_event(AudioStop().event())


async def transcribe(port: int, pcm: bytes, rate: int, **kwargs) -> str:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await send_audio(client, pcm, rate, **kwargs)
        event = await read(client)
    assert event is not None and Transcript.is_type(event.type), event
    return Transcript.from_event(event).text


async def raw_error(port: int, data: bytes) -> Error:
    """Send `data` as is; the `error` event it gets, after which the server must have closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        event = await read(reader)
        assert event is not None and Error.is_type(event.type), event
        assert await read(reader) is None  # closed
        return Error.from_event(event)
    finally:
        writer.close()


def header(**fields) -> bytes:
    return json.dumps(fields).encode() + b"\n"
