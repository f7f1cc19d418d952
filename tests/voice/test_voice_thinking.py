"""A voice turn with a thinking model, without a model: the answer's thoughts are neither sent as
`response.delta` nor handed to speech, and the turn asks a model that can stop thinking to stop.

Run: .venv/bin/python -m pytest -q tests/voice/test_voice_thinking.py
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from homeai.api import voice_turn
from homeai.api.voice_protocol import Settings
from homeai.engine.stats import RequestStats
from homeai.service import Done, Text, Thinking, Usage

THOUGHT = "The user wants the kitchen light; I should say it is on."
STATS = RequestStats("r1", "voice", "alice", "generate", "stop", prompt_tokens=30, output_tokens=20, cached_tokens=0,
                     queue_ms=0.0, ttft_ms=1.0, e2e_ms=2.0, itls_ms=(), preemptions=0)


class Answer:
    """What `service.chat` answers: thoughts first, then the words."""

    def __init__(self):
        self.events = [Thinking(THOUGHT[:20]), Thinking(THOUGHT[20:]), Text("The kitchen light "), Text("is on."),
                       Done("stop", "The kitchen light is on.", (), Usage(30, 20), STATS, THOUGHT)]

    def __aiter__(self):
        return self._events()

    async def _events(self):
        for event in self.events:
            yield event

    def abort(self) -> None:
        pass


class Service:
    def __init__(self):
        self.asks = []

    def lane(self, caller, requested, default):
        return requested, SimpleNamespace(max_tokens=None)

    async def chat(self, ask, caller):
        self.asks.append(ask)
        return Answer()


class Spoken:
    """Speech out as the turn drives it: what it is handed to say."""

    said: list[str] = []

    def __init__(self, *args):
        self.first_audio_ms = None

    async def begin(self):
        pass

    def say(self, text: str) -> None:
        Spoken.said.append(text)

    async def finish(self):
        pass

    async def close(self):
        pass

    async def stop(self):
        pass


def test_thoughts_are_neither_sent_nor_spoken(monkeypatch):
    monkeypatch.setattr(voice_turn, "SpokenAnswer", Spoken)
    sent, service = [], Service()

    async def send(event):
        sent.append(event)

    session = SimpleNamespace(service=service, caller=SimpleNamespace(key="alice"), send=send, voice="joe",
                              speaking=None, runtime=None)
    turn = voice_turn.Turn(session, b"", Settings(16000, None, False, None), ended_at=0.0)
    asyncio.run(turn._answer("Turn on the kitchen light."))

    assert service.asks[0].think.on is False  # a spoken answer does not wait on thoughts
    deltas = [e["text"] for e in sent if e["type"] == "response.delta"]
    assert "".join(deltas) == "The kitchen light is on." == "".join(Spoken.said)
    assert sent[-1]["type"] == "response.done" and sent[-1]["text"] == "The kitchen light is on."
    assert all(THOUGHT[:10] not in str(e) for e in sent)
