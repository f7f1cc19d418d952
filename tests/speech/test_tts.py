"""Text to speech with the real piper voice: heard back by faster-whisper, the pool's priority order,
members taking turns, a left stream stopping, a member over their cap and a full pool refusing.

Run: .venv/bin/python -m pytest tests/speech/test_tts.py
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from homeai.config import Config, TtsConfig
from homeai.doctor import _tts_voice
from homeai.speech.base import SpeechModelError, SynthesisBusy, SynthesisOverCap, embedded_voice, tts_libraries_missing
from homeai.speech.tts import PRIORITY_BACKGROUND, PRIORITY_CHAT, PRIORITY_VOICE, TextToSpeech
from tests.conftest import heard_share

pytestmark = pytest.mark.model

SAID = "The kitchen lights are now turned off, and the front door is locked."
LONG = " ".join(f"This is sentence number {n} of a long story about the garden." for n in range(1, 11))


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def collect(stream) -> list[bytes]:
    return [chunk async for chunk in stream]


async def idle(tts: TextToSpeech, timeout: float = 60.0) -> bool:
    """Wait until nothing is pending on the pool (a generous bound, not a timing check)."""
    for _ in range(int(timeout / 0.02)):
        if tts.num_pending == 0:
            return True
        await asyncio.sleep(0.02)
    return False


# ---- the voice, without synthesis ----------------------------------------------------------

def test_the_embedded_voice_is_found_and_piper_imports():
    assert embedded_voice() is not None and embedded_voice().name == "en_US-joe-medium.onnx"
    assert tts_libraries_missing() is None


def test_a_voice_that_is_not_there_says_so(tmp_path):
    with pytest.raises(SpeechModelError, match="tts.voice"):
        TextToSpeech(TtsConfig(voice=str(tmp_path / "nobody.onnx")))
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    (tmp_path / "broken.onnx.json").write_text("{}")
    with pytest.raises(SpeechModelError, match="cannot load the piper voice"):
        TextToSpeech(TtsConfig(voice=str(broken)))


def test_doctor_says_the_voice_or_why_there_is_none(tmp_path):
    assert "en_US-joe-medium.onnx" in _tts_voice(Config())
    assert _tts_voice(Config(tts=TtsConfig(enabled=False))).startswith("OFF")
    assert _tts_voice(Config(tts=TtsConfig(voice=str(tmp_path / "x.onnx")))).startswith("MISSING")


# ---- synthesis -----------------------------------------------------------------------------

def test_the_voice_is_loaded_by_its_name(tts):
    assert tts.default_voice == "en_US-joe-medium"
    assert list(tts.voices) == ["en_US-joe-medium"]
    assert tts.sample_rate() == tts.sample_rate("en_US-joe-medium") == 22050
    with pytest.raises(KeyError):
        tts.sample_rate("nobody")


def test_what_is_said_is_heard_back(tts, stt):
    pcm = b"".join(tts.synthesize(SAID))
    assert len(pcm) % 2 == 0 and len(pcm) > 2 * 22050  # over a second of audio
    share, heard = heard_share(stt, pcm, tts.sample_rate(), SAID)
    assert share >= 0.7, heard


def test_speed_changes_the_length(tts):
    normal = sum(map(len, tts.synthesize("One two three four five six.")))
    fast = sum(map(len, tts.synthesize("One two three four five six.", speed=2.0)))
    slow = sum(map(len, tts.synthesize("One two three four five six.", speed=0.5)))
    assert fast < 0.75 * normal < normal < 0.75 * slow


@pytest.mark.anyio
async def test_a_stream_gives_a_chunk_per_sentence_heard_back(tts, stt):
    chunks = await collect(tts.stream("Good morning. It is sunny today. Take a hat.", member="alice",
                                      priority=PRIORITY_CHAT))
    assert len(chunks) == 3
    share, heard = heard_share(stt, b"".join(chunks), tts.sample_rate(), "good morning it is sunny today take a hat")
    assert share >= 0.7, heard
    assert await idle(tts)


@pytest.mark.anyio
async def test_an_unknown_voice_is_refused_before_queueing(tts):
    with pytest.raises(KeyError):
        await collect(tts.stream("Hello.", member="alice", voice="nobody"))
    assert tts.num_pending == 0


# ---- the pool ------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_waiting_work_is_taken_by_priority_then_arrival(tts):
    """One worker, one member: a long background read-aloud is running; chat, then voice, then another
    chat arrive. Each next chunk goes to the most urgent: voice, then the chats in order, then background."""
    assert tts.cfg.workers == 1
    order: list[str] = []

    async def consume(name: str, text: str, priority: int, started: asyncio.Event | None = None):
        async for _ in tts.stream(text, member="alice", priority=priority):
            order.append(name)
            if started is not None:
                started.set()

    started = asyncio.Event()
    background = asyncio.create_task(consume("background", LONG, PRIORITY_BACKGROUND, started))
    await started.wait()
    others = [asyncio.create_task(consume(name, text, priority)) for name, text, priority in (
        ("chat1", "First chat answer. It has two sentences.", PRIORITY_CHAT),
        ("voice", "The voice answer. Spoken first.", PRIORITY_VOICE),
        ("chat2", "Second chat answer.", PRIORITY_CHAT))]
    await asyncio.gather(background, *others)
    assert len(order) == 10 + 2 + 2 + 1
    first_voice = order.index("voice")
    assert set(order[:first_voice]) == {"background"} and first_voice <= 4  # the chunks already under way
    assert order[first_voice:first_voice + 5] == ["voice", "voice", "chat1", "chat1", "chat2"]
    assert set(order[first_voice + 5:]) == {"background"}


@pytest.mark.anyio
async def test_a_stream_left_stops_at_the_next_chunk(tts, monkeypatch):
    made = []
    synthesize = tts.synthesize

    def counted(text, **kwargs):
        for chunk in synthesize(text, **kwargs):
            made.append(len(chunk))
            yield chunk

    monkeypatch.setattr(tts, "synthesize", counted)
    async with contextlib.aclosing(tts.stream(LONG, member="alice", priority=PRIORITY_CHAT)) as stream:
        async for _ in stream:
            break  # the listener leaves after the first sentence
    assert await idle(tts)
    assert 1 <= len(made) <= 3, made  # the first, the one in progress, at most one more: not all ten


@pytest.mark.anyio
async def test_a_cancelled_listener_stops_its_synthesis(tts, monkeypatch):
    made = []
    synthesize = tts.synthesize

    def counted(text, **kwargs):
        for chunk in synthesize(text, **kwargs):
            made.append(len(chunk))
            yield chunk

    monkeypatch.setattr(tts, "synthesize", counted)
    first = asyncio.Event()

    async def listen():
        async for _ in tts.stream(LONG, member="alice", priority=PRIORITY_VOICE):
            first.set()

    task = asyncio.create_task(listen())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await idle(tts)
    assert 1 <= len(made) <= 3, made


@pytest.mark.anyio
async def test_members_take_turns_on_the_worker(tts):
    """One worker: alice's four long read-alouds are under way when bob asks for three sentences.
    His are made turn about with hers (in arrival order they would wait for her forty)."""
    order: list[str] = []
    started = asyncio.Event()

    async def consume(name: str, member: str, text: str):
        async for _ in tts.stream(text, member=member, priority=PRIORITY_CHAT):
            order.append(name)
            started.set()

    alice = [asyncio.create_task(consume("alice", "alice", LONG)) for _ in range(4)]
    await started.wait()
    bob_from = len(order)
    await consume("bob", "bob", "This is sentence number one of bob. This is sentence number two of bob. "
                                "This is sentence number three of bob.")
    for task in alice:
        task.cancel()
    await asyncio.gather(*alice, return_exceptions=True)
    assert await idle(tts)
    assert order.count("bob") == 3
    bob_done = len(order) - order[::-1].index("bob")  # chunks made when his last came
    # Each of his waits at most for the chunk under way and a turn of hers: not her backlog of forty.
    assert bob_done - bob_from <= 3 * 2 + 2, order


@pytest.mark.anyio
async def test_a_member_over_their_cap_is_refused_and_others_are_not(tts):
    cap = tts.admission.max_pending_per_member
    slots = [tts.open("alice", PRIORITY_CHAT) for _ in range(cap)]
    try:
        with pytest.raises(SynthesisOverCap, match=f"tts.max_pending_per_member = {cap}"):
            await collect(tts.stream("One more.", member="alice", priority=PRIORITY_CHAT))
        assert tts.pending_of("alice") == cap
        assert await collect(tts.stream("Bob is still heard.", member="bob", priority=PRIORITY_CHAT))
        assert await collect(tts.stream("Carol too.", member="carol", priority=PRIORITY_VOICE))
    finally:
        for slot in slots:
            slot.close()
    assert tts.num_pending == 0
    assert await collect(tts.stream("Alice again.", member="alice", priority=PRIORITY_CHAT))


@pytest.mark.anyio
async def test_a_full_pool_is_busy_keeps_voices_room_and_frees_itself(tts):
    admission = tts.admission
    room = admission.max_pending - admission.voice_reserve
    slots = [tts.open(f"member{i}", PRIORITY_BACKGROUND) for i in range(room)]
    try:
        with pytest.raises(SynthesisBusy) as caught:
            await collect(tts.stream("No room.", member="newcomer", priority=PRIORITY_CHAT))
        assert not isinstance(caught.value, SynthesisOverCap) and "busy" in str(caught.value)
        voiced = [tts.open(f"voice{i}", PRIORITY_VOICE) for i in range(admission.voice_reserve - 1)]
        slots.extend(voiced)
        assert await collect(tts.stream("The last voice slot.", member="carol", priority=PRIORITY_VOICE))
        slots.append(tts.open("carol", PRIORITY_VOICE))
        with pytest.raises(SynthesisBusy):
            tts.open("dave", PRIORITY_VOICE)
    finally:
        for slot in slots:
            slot.close()
    assert tts.num_pending == 0
    assert await collect(tts.stream("Free again.", member="newcomer", priority=PRIORITY_CHAT))  # it takes work again
