"""Wyoming framing without a server: events read from a stream fed by hand, and what we write
read back by the `wyoming` package's own reader.

Run: .venv/bin/python -m pytest tests/wyoming/test_framing.py
"""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from wyoming.event import read_event as their_read_event

from homeai.wyoming.framing import Event, WyomingError, encode, read_event

MAX = 4096


def read(raw: bytes, limit: int = MAX) -> Event | None:
    async def go():
        reader = asyncio.StreamReader(limit=limit)
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_event(reader, MAX)

    return asyncio.run(go())


def line(**fields) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def test_data_after_the_header_and_a_payload():
    data = json.dumps({"rate": 16000, "width": 2, "channels": 1}).encode()
    event = read(line(type="audio-chunk", version="1.5.2", data_length=len(data), payload_length=4)
                 + data + b"\x01\x00\x02\x00")
    assert event == Event("audio-chunk", {"rate": 16000, "width": 2, "channels": 1}, b"\x01\x00\x02\x00")


def test_data_inline_and_after_are_merged():
    data = b'{"language": "en"}'
    event = read(line(type="transcribe", data={"name": "tiny.en", "language": "de"}, data_length=len(data)) + data)
    assert event.data == {"name": "tiny.en", "language": "en"}


def test_end_of_stream_between_events_is_none():
    assert read(b"") is None


@pytest.mark.parametrize("raw, code", [
    (b"not json\n", "bad_frame"),
    (b"\xff\xfe\n", "bad_frame"),
    (b"[]\n", "bad_frame"),
    (line(data={}), "bad_frame"),
    (line(type=""), "bad_frame"),
    (line(type="describe", data_length=True), "bad_frame"),
    (line(type="describe", data_length=1.5), "bad_frame"),
    (line(type="describe", payload_length=MAX + 1), "frame_too_large"),
    (line(type="describe", data_length=MAX + 1), "frame_too_large"),
    (line(type="describe", data_length=10) + b"{}", "bad_frame"),  # ends inside the data
    (line(type="describe", payload_length=10) + b"abc", "bad_frame"),  # ends inside the payload
    (b'{"type": "describe"', "bad_frame"),  # ends inside the header
    (b"[" * 100_000 + b"\n", "bad_frame"),  # nested too deeply for the JSON parser
])
def test_bad_frames(raw, code):
    with pytest.raises(WyomingError) as error:
        read(raw, limit=200_000)
    assert error.value.code == code and error.value.text


def test_a_header_line_over_the_stream_limit():
    with pytest.raises(WyomingError) as error:
        read(b'{"type": "' + b"x" * 2 * MAX + b'"}\n')
    assert error.value.code == "frame_too_large"


def test_what_we_write_the_wyoming_package_reads():
    sent = Event("transcript", {"text": "turn on the kitchen lights", "language": "en"})
    theirs = their_read_event(io.BytesIO(encode(sent) + encode(Event("pong", payload=b"ab"))))
    assert (theirs.type, theirs.data, theirs.payload) == ("transcript", sent.data, None)
    assert read(encode(sent)) == sent
