"""Streaming transcripts (`wyoming.transcript_streaming`), read with the `wyoming` package's client:
after the audio, transcript-start, a transcript-chunk per Whisper segment as it is decoded, the
whole `transcript` (for clients that wait for it alone), then transcript-stop. Without the key
the one `transcript` event is all (tests/wyoming/test_wyoming.py).

Run: .venv/bin/python -m pytest tests/wyoming/test_transcript_streaming.py
"""

from __future__ import annotations

import numpy as np
import pytest
from wyoming.asr import Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from tests.wyoming.conftest import heard, read, send_audio, serve, wyoming_config

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def port(module_tmp, runner, stt):
    with serve(wyoming_config(module_tmp, transcript_streaming=True), runner, stt) as (_server, listening):
        yield listening


async def streamed(client) -> tuple[list[str], str]:
    """The events of one streamed transcript, checked in order: (the chunks' texts, the transcript's)."""
    start = await read(client)
    assert TranscriptStart.is_type(start.type), start
    assert TranscriptStart.from_event(start).language == "en"
    chunks = []
    while TranscriptChunk.is_type((event := await read(client)).type):
        chunks.append(TranscriptChunk.from_event(event).text)
    assert Transcript.is_type(event.type), event
    text = Transcript.from_event(event).text
    stop = await read(client)
    assert TranscriptStop.is_type(stop.type), stop
    return chunks, text


async def test_describe_says_transcripts_stream(port):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        [asr] = Info.from_event(await read(client)).asr
    assert asr.supports_transcript_streaming


async def test_speech_is_streamed_as_chunks_then_the_whole(port, utterance):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await send_audio(client, utterance.raw_16k, 16000)
        chunks, text = await streamed(client)
    assert chunks and "".join(chunks) == text and heard(text), (chunks, text)


async def test_each_segment_is_a_chunk(port, utterance):
    """The sentence twice, three seconds apart: Whisper makes a segment of each (or one of both);
    either way the chunks are the segments in order, joined into the transcript."""
    pause = np.zeros(3 * 16000, dtype="<i2").tobytes()
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await send_audio(client, utterance.raw_16k + pause + utterance.raw_16k, 16000)
        chunks, text = await streamed(client)
    assert "".join(chunks) == text and text.lower().count("kitchen") == 2, (chunks, text)
    assert all(chunk.strip() for chunk in chunks), chunks


async def test_empty_audio_streams_an_empty_transcript(port):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for _ in range(2):  # one connection, one stream per utterance
            await send_audio(client, b"", 16000)
            assert await streamed(client) == ([], "")
