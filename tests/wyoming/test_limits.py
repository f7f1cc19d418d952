"""Bounded Wyoming listener (issue 26): connections capped in all and per client address, audio
buffered per connection capped, and an event with text that is not valid Unicode answered with an
`error` event while the connection goes on. Spoken to with the `wyoming` package's client, and
with raw sockets where that client cannot write the frame (it refuses a lone surrogate itself).

Several client addresses come from binding the client's socket to 127.0.0.N: Linux routes all of
127.0.0.0/8 to loopback.

Run: .venv/bin/python -m pytest tests/wyoming/test_limits.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import pytest
from wyoming.asr import Transcript
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import async_write_event
from wyoming.info import Info
from wyoming.ping import Pong

from tests.wyoming.conftest import heard, read, send_audio, serve, wyoming_config

pytestmark = [pytest.mark.model, pytest.mark.anyio]

MAX_CONNECTIONS = 4
PER_ADDRESS = 2
MAX_AUDIO_BYTES = 160_000  # 5 s at 16 kHz: the test utterance fits


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return wyoming_config(module_tmp, max_connections=MAX_CONNECTIONS, max_connections_per_address=PER_ADDRESS,
                          max_audio_bytes=MAX_AUDIO_BYTES)


@pytest.fixture(scope="module")
def port(cfg, runner, stt):
    with serve(cfg, runner, stt) as (_server, listening):
        yield listening


@contextlib.asynccontextmanager
async def connection(port: int, address: str = "127.0.0.1"):
    """A raw connection from `address`: (reader, writer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def describe(reader, writer):
    """The answer to a `describe` on a raw connection: info for an accepted one, an error for a refused one."""
    with contextlib.suppress(ConnectionError):  # a refused connection may be closed before the write
        writer.write(json.dumps({"type": "describe"}).encode() + b"\n")
        await writer.drain()
    return await read(reader)


async def assert_refused(port: int, address: str, limit: str) -> None:
    async with connection(port, address) as (reader, writer):
        event = await describe(reader, writer)
        assert event is not None and Error.is_type(event.type), event
        error = Error.from_event(event)
        assert error.code == "too_many_connections" and limit in error.text, error
        assert await read(reader) is None  # and closed


async def assert_served(port: int, address: str) -> None:
    async with connection(port, address) as (reader, writer):
        event = await describe(reader, writer)
        assert event is not None and Info.is_type(event.type), event


# ---- connections ------------------------------------------------------------------------------


async def test_one_address_holds_at_most_its_share(port):
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(PER_ADDRESS):
            reader, writer = await stack.enter_async_context(connection(port, "127.0.0.2"))
            assert Info.is_type((await describe(reader, writer)).type)
        await assert_refused(port, "127.0.0.2", "wyoming.max_connections_per_address")
        await assert_served(port, "127.0.0.3")  # another address is still served
    await assert_served(port, "127.0.0.2")  # once closed, the address is served again


async def test_the_listener_holds_at_most_max_connections(port):
    async with contextlib.AsyncExitStack() as stack:
        for i in range(MAX_CONNECTIONS):
            reader, writer = await stack.enter_async_context(connection(port, f"127.0.0.{10 + i}"))
            assert Info.is_type((await describe(reader, writer)).type)
        await assert_refused(port, "127.0.0.30", "wyoming.max_connections")
    await assert_served(port, "127.0.0.30")


async def test_the_wyoming_client_is_told_why_it_is_refused(port):
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(PER_ADDRESS):
            reader, writer = await stack.enter_async_context(connection(port))
            assert Info.is_type((await describe(reader, writer)).type)
        client = AsyncTcpClient("127.0.0.1", port)
        await client.connect()
        try:
            event = await read(client)  # the refusal comes unasked
        finally:
            await client.disconnect()
    assert Error.is_type(event.type) and Error.from_event(event).code == "too_many_connections", event


async def test_refusals_are_logged_without_a_line_each(port, caplog):
    caplog.set_level(logging.WARNING, logger="homeai.wyoming")
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(PER_ADDRESS):
            reader, writer = await stack.enter_async_context(connection(port, "127.0.0.40"))
            assert Info.is_type((await describe(reader, writer)).type)
        for _ in range(5):
            await assert_refused(port, "127.0.0.40", "wyoming.max_connections_per_address")
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) <= 1, lines  # at most one a minute, with the count (earlier tests may have logged)


# ---- audio ------------------------------------------------------------------------------------


async def test_audio_over_max_audio_bytes_is_an_error_and_the_utterance_is_dropped(port):
    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=bytes(3200)).event()  # 0.1 s, 3200 bytes
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for _ in range(MAX_AUDIO_BYTES // 3200 + 1):  # the last chunk goes over
            await client.write_event(chunk)
        event = await read(client)
        assert await read(client) is None  # closed
    assert Error.is_type(event.type), event
    error = Error.from_event(event)
    assert error.code == "audio_too_large" and "wyoming.max_audio_bytes" in error.text, error


async def test_a_client_still_streaming_after_the_error_reads_it(port):
    """A microphone keeps sending after the server ended the utterance: the server reads and drops the
    rest before it closes, since a socket closed with unread input is reset and the error lost with it
    (the client then read a reset or nothing; seen with a refused member as well)."""
    chunk = AudioChunk(rate=16000, width=2, channels=1, audio=bytes(3200)).event()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        for _ in range(MAX_AUDIO_BYTES // 3200 + 1):
            await client.write_event(chunk)
        await asyncio.sleep(0.5)  # the server has ended the utterance by now
        for _ in range(40):  # and the microphone goes on: 128 KB more
            await client.write_event(chunk)
        event = await read(client)
    assert Error.is_type(event.type), event
    assert Error.from_event(event).code == "audio_too_large"


# ---- text that is not Unicode -------------------------------------------------------------------


SURROGATE_EVENTS = [
    {"type": "ping", "data": {"text": "\ud800"}},  # the probe of the issue
    {"type": "transcribe", "data": {"language": "en", "name": "\udfff"}},
    {"type": "describe", "data": {"\ud800": 1}},  # in a key
    {"type": "ping\ud800"},  # in the type
    {"type": "ping", "version": "1.\ud800"},
    {"type": "something-new", "data": {"nested": [{"deep": "a\ud800b"}]}},  # an unknown event too
]


@pytest.mark.parametrize("event", SURROGATE_EVENTS, ids=lambda e: json.dumps(e))
async def test_a_lone_surrogate_gets_an_error_and_the_connection_goes_on(port, event, caplog):
    caplog.set_level(logging.ERROR, logger="homeai.wyoming")
    async with connection(port) as (reader, writer):
        writer.write(json.dumps(event).encode() + b"\n")  # json.dumps writes it as the escape \ud800
        error = await read(reader)
        assert error is not None and Error.is_type(error.type), error
        assert Error.from_event(error).code == "invalid_text", error
        writer.write(json.dumps({"type": "ping", "data": {"text": "still here"}}).encode() + b"\n")
        pong = await read(reader)
    assert Pong.is_type(pong.type) and Pong.from_event(pong).text == "still here", pong
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # no traceback


async def test_a_lone_surrogate_in_data_bytes_gets_an_error(port):
    data = json.dumps({"text": "\ud800"}).encode()
    async with connection(port) as (reader, writer):
        writer.write(json.dumps({"type": "ping", "data_length": len(data)}).encode() + b"\n" + data)
        error = await read(reader)
        assert Error.from_event(error).code == "invalid_text", error
        assert "data.text" in Error.from_event(error).text


async def test_a_surrogate_written_as_utf8_bytes_gets_an_error(port):
    """0xED 0xA0 0x80 is U+D800 in UTF-8's pattern: not UTF-8, but json.loads lets it through."""
    async with connection(port) as (reader, writer):
        writer.write(b'{"type": "ping", "data": {"text": "\xed\xa0\x80"}}\n')
        assert Error.from_event(await read(reader)).code == "invalid_text"
        writer.write(b'{"type": "ping", "data": {"text": "\xed\x95\x9c"}}\n')  # U+D55C, a Hangul letter
        pong = await read(reader)
    assert Pong.is_type(pong.type) and Pong.from_event(pong).text == "\ud55c", pong


async def test_an_utterance_goes_on_after_a_refused_event(port, utterance):
    """Home Assistant's turn, written by the `wyoming` package, after a refused ping on the same connection."""
    async with connection(port) as (reader, writer):
        writer.write(json.dumps({"type": "ping", "data": {"text": "\ud800"}}).encode() + b"\n")
        assert Error.from_event(await read(reader)).code == "invalid_text"
        await send_audio(EventWriter(writer), utterance.raw_16k, 16000)
        event = await read(reader)
    assert Transcript.is_type(event.type) and heard(Transcript.from_event(event).text), event


class EventWriter:
    """A raw connection's writer as the `wyoming` client's `write_event`."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer

    async def write_event(self, event) -> None:
        await async_write_event(event, self.writer)
