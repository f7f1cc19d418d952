"""The voice socket end to end: real speech streamed in 20 ms frames, a real answer streamed back.

Run: .venv/bin/python -m pytest tests/voice/test_voice.py
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from homeai.api import voice_turn
from homeai.service import SamplingAsk
from homeai.store.conversations import create_conversation, get_conversation
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import DEFAULT_MEMBER
from homeai.store.models import Member
from tests.api.conftest import api_config
from tests.voice.conftest import heard, poll, serve, silence, voice_client, voice_idle

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, lanes={"voice": {"max_tokens": 48}})


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve(cfg, runner, stt) as running:
        yield running


@pytest.fixture
def endless_answers(monkeypatch):
    """Answers that cannot end on their own before a cancel: no end-of-generation, 4000 tokens."""
    monkeypatch.setattr(voice_turn, "answer_sampling", lambda policy: SamplingAsk(max_tokens=4000, ignore_eos=True))


def check_answer(events: list[dict]) -> dict:
    """The transcript heard the key words, the answer streamed and completed with timings."""
    transcript = next(e for e in events if e["type"] == "transcript.final")
    assert heard(transcript["text"]), transcript
    deltas = [e["text"] for e in events if e["type"] == "response.delta"]
    done = events[-1]
    assert done["type"] == "response.done", events[-3:]
    assert deltas and done["text"] == "".join(deltas) and done["text"].strip()
    assert done["finish_reason"] in ("stop", "length")
    timings = done["timings"]
    assert set(timings) == {"stt_ms", "ttft_ms", "total_ms"}
    assert 0 < timings["stt_ms"] <= timings["ttft_ms"] <= timings["total_ms"]
    return done


async def test_a_spoken_question_gets_a_streamed_answer(server, utterance):
    async with voice_client(server) as client:
        ready = await client.start()
        assert ready["member"] == DEFAULT_MEMBER and ready["vad"] is False
        check_answer(await client.ask(utterance.raw_16k))
        # The socket takes the next question.
        check_answer(await client.ask(utterance.raw_16k))
    assert await poll(lambda: voice_idle(server))


@pytest.mark.parametrize("rate", [16000, 22050])
async def test_server_vad_ends_the_utterance_and_silence_does_not_barge_in(server, utterance, rate):
    speech = utterance.raw_16k if rate == 16000 else utterance.raw_22k
    async with voice_client(server) as client:
        await client.start(sample_rate=rate, vad=True)
        # No audio.end: the server hears the silence after the speech; the rest of the
        # silence arrives while it answers and must not interrupt it.
        await client.audio(silence(0.5, rate) + speech + silence(2.0, rate), frame=2 * rate // 50)
        check_answer(await client.until("response.done", "error"))


async def test_a_conversation_keeps_the_exchange(cfg, server, utterance):
    engine = make_engine(cfg.database_url)
    sessions = make_sessionmaker(engine)
    try:
        with sessions() as session:
            member_id = session.scalar(select(Member.id).where(Member.name == DEFAULT_MEMBER))
            conversation_id = create_conversation(session, member_id=member_id, title="kitchen").id
        async with voice_client(server) as client:
            await client.start(conversation_id=conversation_id)
            events = await client.ask(utterance.raw_16k)
            done = check_answer(events)
            transcript = events[0]["text"]

        def stored():
            with sessions() as session:
                messages = get_conversation(session, member_id=member_id, conversation_id=conversation_id).messages
                return [(m.role, m.content) for m in messages]
        assert await poll(lambda: len(stored()) == 2)
        assert stored() == [("user", transcript), ("assistant", done["text"])]
    finally:
        engine.dispose()


async def test_cancel_aborts_the_answer_and_frees_its_sequence(server, utterance, endless_answers):
    async with voice_client(server) as client:
        await client.start()
        await client.audio(utterance.raw_16k)
        await client.send(type="audio.end")
        await client.until("response.delta")
        assert server.program.engine.state().lanes["voice"].running == 1
        await client.send(type="response.cancel")
        done = (await client.until("response.done"))[-1]
        assert done["finish_reason"] == "cancelled" and done["timings"]["ttft_ms"] is not None
        assert await poll(lambda: voice_idle(server))
        await client.send(type="response.cancel")  # nothing in progress: nothing happens
        # The socket still works: a new session.start answers at once.
        await client.start()


async def test_barge_in_interrupts_the_answer_and_the_new_utterance_is_answered(server, utterance, endless_answers):
    async with voice_client(server) as client:
        await client.start()
        await client.audio(utterance.raw_16k)
        await client.send(type="audio.end")
        await client.until("response.delta")
        # The user speaks again over the answer.
        await client.audio(utterance.raw_16k[:6400])
        interrupted = (await client.until("response.done"))[-1]
        assert interrupted["finish_reason"] == "interrupted" and interrupted["text"]
        assert await poll(lambda: voice_idle(server))
        await client.audio(utterance.raw_16k[6400:])
        await client.send(type="audio.end")
        events = await client.until("response.delta")
        assert heard(next(e for e in events if e["type"] == "transcript.final")["text"])
        await client.send(type="response.cancel")
        assert (await client.until("response.done"))[-1]["finish_reason"] == "cancelled"
    assert await poll(lambda: voice_idle(server))


async def test_a_client_that_leaves_mid_answer_frees_its_sequence(server, utterance, endless_answers):
    async with voice_client(server) as client:
        await client.start()
        await client.audio(utterance.raw_16k)
        await client.send(type="audio.end")
        await client.until("response.delta")
    assert await poll(lambda: voice_idle(server))
