"""Wyoming text to speech end to end, spoken to with the `wyoming` package's client as Home Assistant
does: describe lists the voice, `synthesize` and streaming synthesis answer audio that the speech
model hears back with most of the words given, bad input is an `error` event naming the field while
the connection goes on, `wyoming.member` must be allowed the voice lane, and a client that leaves
stops its synthesis.

Run: .venv/bin/python -m pytest tests/wyoming/test_tts.py
"""

from __future__ import annotations

import asyncio
import json

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped,
                         SynthesizeVoice)

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import ALL_LANES, set_lanes
from tests.api.conftest import TIMEOUT, add_token, api_config
from tests.conftest import heard_share
from tests.wyoming.conftest import read, serve

pytestmark = [pytest.mark.model, pytest.mark.anyio]

VOICE = "en_US-joe-medium"
MEMBER = "ha"  # whom Wyoming clients act as
MAX_CHARS = 2000
SAID = "Turn on the kitchen lights and close the blinds."
SENTENCES = ["The kitchen lights are on.", "The front door is locked.", "The music is playing in the living room."]
STORY = [f"This is sentence number {n} of a long story." for n in range(1, 31)]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, wyoming={"enabled": True, "port": 0, "member": MEMBER},
                      tts={"max_chars": MAX_CHARS})


@pytest.fixture(scope="module")
def started(cfg, runner, stt, tts):
    with serve(cfg, runner, stt, tts) as running:
        add_token(cfg, MEMBER)  # every lane, voice among them
        yield running


@pytest.fixture(scope="module")
def port(started):
    return started[1]


def connect(port: int) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", port)


async def audio_stream(client) -> tuple[AudioStart, bytes]:
    """One audio stream: audio-start, its chunks (each in the format announced), audio-stop."""
    event = await read(client)
    assert event is not None and AudioStart.is_type(event.type), event
    start = AudioStart.from_event(event)
    pcm = bytearray()
    while not AudioStop.is_type((event := await read(client)).type):
        assert AudioChunk.is_type(event.type), event
        chunk = AudioChunk.from_event(event)
        assert (chunk.rate, chunk.width, chunk.channels) == (start.rate, start.width, start.channels)
        pcm += chunk.audio
    return start, bytes(pcm)


async def assert_still_served(client) -> None:
    await client.write_event(Ping(text="still here").event())
    pong = await read(client)
    assert Pong.is_type(pong.type) and Pong.from_event(pong).text == "still here", pong


def assert_heard(stt, pcm: bytes, rate: int, said: str) -> None:
    """Most of the words said are heard back by faster-whisper (resampled to 16 kHz by
    `homeai.speech.base.resample` inside transcribe_pcm16); never the exact text."""
    share, heard = heard_share(stt, pcm, rate, said)
    assert share >= 0.7, (said, heard)


def pieces(text: str, size: int = 7) -> list[str]:
    """Text cut as a language model writes it: a few characters at a time, across words."""
    return [text[i:i + size] for i in range(0, len(text), size)]


def member_lanes(cfg, lanes) -> None:
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            set_lanes(session, name=MEMBER, lanes=lanes)
    finally:
        engine.dispose()


async def test_describe_lists_the_voice_beside_the_speech_model(port):
    async with connect(port) as client:
        await client.write_event(Describe().event())
        info = Info.from_event(await read(client))
    [asr] = info.asr
    assert asr.models[0].name == "tiny.en"
    [program] = info.tts
    assert program.installed and program.supports_synthesize_streaming and program.attribution.url
    [voice] = program.voices
    assert (voice.name, voice.languages, voice.installed) == (VOICE, ["en_US"], True)


@pytest.mark.parametrize("voice", [None, SynthesizeVoice(name=VOICE)], ids=["default", "by-name"])
async def test_synthesized_speech_is_heard_back(port, stt, voice):
    async with connect(port) as client:
        await client.write_event(Synthesize(text=SAID, voice=voice).event())
        start, pcm = await audio_stream(client)
    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    assert_heard(stt, pcm, start.rate, SAID)


async def test_streamed_text_is_spoken_a_sentence_at_a_time(port, stt):
    text = " ".join(SENTENCES)
    cut = len(SENTENCES[0]) + 5  # into the second sentence's first word: the first is whole
    async with connect(port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=VOICE)).event())
        for piece in pieces(text[:cut]):
            await client.write_event(SynthesizeChunk(text=piece).event())
        streams = [await audio_stream(client)]  # the first sentence is heard before the rest is written
        for piece in pieces(text[cut:]):
            await client.write_event(SynthesizeChunk(text=piece).event())
        await client.write_event(Synthesize(text=text).event())  # for servers that do not stream: ignored
        await client.write_event(SynthesizeStop().event())
        for _ in SENTENCES[1:]:
            streams.append(await audio_stream(client))
        stopped = await read(client)
        assert SynthesizeStopped.is_type(stopped.type), stopped
        await assert_still_served(client)  # and nothing more was said: the whole text was not spoken again
    for sentence, (start, pcm) in zip(SENTENCES, streams):
        assert_heard(stt, pcm, start.rate, sentence)


async def test_a_thought_spanning_many_chunks_and_sentences_is_never_spoken(port, stt):
    """A thinking model's answer handed on as Home Assistant streams it: the thought's sentences
    arrive in many chunks before the answer's; only the answer's sentences are spoken."""
    thought = "<think>The user wants the lights on. I should check the kitchen first. Then confirm.</think>\n\n"
    text = thought + " ".join(SENTENCES[:2])
    async with connect(port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=VOICE)).event())
        for piece in pieces(text):
            await client.write_event(SynthesizeChunk(text=piece).event())
        await client.write_event(SynthesizeStop().event())
        streams = []
        while not SynthesizeStopped.is_type((event := await read(client)).type):
            assert AudioStart.is_type(event.type), event
            pcm = bytearray()
            while not AudioStop.is_type((event := await read(client)).type):
                pcm += AudioChunk.from_event(event).audio
            streams.append(bytes(pcm))
    assert len(streams) == 2  # the answer's two sentences, none of the thought's three
    for sentence, pcm in zip(SENTENCES, streams):
        assert_heard(stt, pcm, 22050, sentence)


@pytest.mark.parametrize("event, field", [
    (Synthesize(text=SAID, voice=SynthesizeVoice(name="nobody")), "voice"),
    (Synthesize(text=""), "text"),
    (Synthesize(text="   "), "text"),
    (Synthesize(text="word " * (MAX_CHARS // 5 + 1)), "text"),
    (SynthesizeStart(voice=SynthesizeVoice(name="nobody")), "voice"),
], ids=["unknown-voice", "empty", "blank", "over-the-cap", "stream-unknown-voice"])
async def test_bad_input_is_an_error_naming_the_field_and_the_connection_goes_on(port, event, field):
    async with connect(port) as client:
        await client.write_event(event.event())
        answer = await read(client)
        assert Error.is_type(answer.type), answer
        error = Error.from_event(answer)
        assert error.code == "invalid_value" and f"'{field}'" in error.text, error
        await assert_still_served(client)


async def test_a_stream_over_the_cap_is_an_error_and_is_not_spoken(port):
    async with connect(port) as client:
        await client.write_event(SynthesizeStart().event())
        await client.write_event(SynthesizeChunk(text="word " * (MAX_CHARS // 5 + 1)).event())
        error = Error.from_event(await read(client))
        assert error.code == "invalid_value" and "'text'" in error.text and "tts.max_chars" in error.text
        await client.write_event(SynthesizeChunk(text="More. ").event())  # the rest is dropped too
        await client.write_event(SynthesizeStop().event())
        stopped = await read(client)
        assert SynthesizeStopped.is_type(stopped.type), stopped  # no audio before it


@pytest.mark.parametrize("text, what", [("Hello\x00 there.", "U+0000"), ("The bell\x07 rings.", "U+0007"),
                                        ("Colour\x1b[31m red.", "U+001B")], ids=["nul", "bell", "escape"])
async def test_text_a_synthesiser_cannot_take_is_an_error_naming_text(port, stt, text, what):
    async with connect(port) as client:
        await client.write_event(Synthesize(text=text).event())
        error = Error.from_event(await read(client))
        assert error.code == "invalid_text" and "'text'" in error.text and what in error.text, error
        await client.write_event(SynthesizeStart().event())  # in a stream's chunk: the rest is not spoken
        await client.write_event(SynthesizeChunk(text=text + " ").event())
        error = Error.from_event(await read(client))
        assert error.code == "invalid_text" and "'text'" in error.text and "rest of the stream" in error.text
        await client.write_event(SynthesizeChunk(text="More words. ").event())
        await client.write_event(SynthesizeStop().event())
        stopped = await read(client)
        assert SynthesizeStopped.is_type(stopped.type), stopped  # no audio before it
        await client.write_event(Synthesize(text=SAID.replace(" and ", "\tand\r\n")).event())  # tab, line breaks: said
        start, pcm = await audio_stream(client)
    assert_heard(stt, pcm, start.rate, SAID)


async def test_a_lone_surrogate_is_an_error_naming_the_text(port):
    """The `wyoming` client cannot encode one (UTF-8 cannot carry it): written as JSON's escape."""
    async with connect(port) as client:
        reader, writer = client._reader, client._writer
        line = json.dumps({"type": "synthesize", "data": {"text": "Half a face \ud83d here."}})
        assert "\\ud83d" in line
        writer.write(line.encode() + b"\n")
        await writer.drain()
        error = Error.from_event(await read(reader))
        assert error.code == "invalid_text" and "data.text" in error.text, error
        await assert_still_served(client)


async def test_chunks_outside_a_stream_are_errors(port):
    async with connect(port) as client:
        for event in (SynthesizeChunk(text="Hello."), SynthesizeStop()):
            await client.write_event(event.event())
            error = Error.from_event(await read(client))
            assert error.code == "synthesize_not_started", error
        await assert_still_served(client)


async def test_synthesis_needs_the_member_allowed_the_voice_lane(cfg, port, stt):
    member_lanes(cfg, ["chat"])
    try:
        async with connect(port) as client:
            await client.write_event(Synthesize(text=SAID).event())
            error = Error.from_event(await read(client))
            assert error.code == "lane_not_allowed" and MEMBER in error.text, error
            assert await read(client) is None  # closed, as for an utterance
    finally:
        member_lanes(cfg, ALL_LANES)
    async with connect(port) as client:  # allowed again: heard at once
        await client.write_event(Synthesize(text=SAID).event())
        start, pcm = await audio_stream(client)
    assert_heard(stt, pcm, start.rate, SAID)


async def test_wyoming_member_at_their_cap_is_told_so_and_the_connection_goes_on(tts, port, stt):
    """Wyoming speaks as `wyoming.member`: its share of the speech-out pool is that member's, shared
    with their other clients; at the cap a synthesis is an error event naming it."""
    cap = tts.admission.max_pending_per_member
    slots = [tts.open(MEMBER, 1) for _ in range(cap)]  # the member's read-alouds elsewhere
    try:
        async with connect(port) as client:
            await client.write_event(Synthesize(text=SAID).event())
            error = Error.from_event(await read(client))
            assert error.code == "tts_busy" and f"tts.max_pending_per_member = {cap}" in error.text, error
            await assert_still_served(client)
    finally:
        for slot in slots:
            slot.close()
    async with connect(port) as client:  # one ended: heard at once
        await client.write_event(Synthesize(text=SAID).event())
        start, pcm = await audio_stream(client)
    assert_heard(stt, pcm, start.rate, SAID)


async def test_a_client_that_leaves_stops_its_synthesis(started, tts, monkeypatch):
    server, port = started
    made = []  # one chunk per sentence piper synthesises
    synthesize = tts.synthesize

    def counted(*args, **kwargs):
        for chunk in synthesize(*args, **kwargs):
            made.append(len(chunk))
            yield chunk

    monkeypatch.setattr(tts, "synthesize", counted)
    client = connect(port)
    await client.connect()
    await client.write_event(Synthesize(text=" ".join(STORY)).event())
    assert AudioStart.is_type((await read(client)).type)
    await client.disconnect()
    listener = server.app.state.wyoming
    assert await until(lambda: not listener._per_address and tts.num_pending == 0)  # the session has ended
    assert 1 <= len(made) < len(STORY), len(made)


async def until(predicate, timeout: float = TIMEOUT) -> bool:
    """Poll `predicate` until it holds (a generous bound, not a timing check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
