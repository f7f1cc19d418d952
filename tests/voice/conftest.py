"""Fixtures for the voice tests: real speech (espeak-ng and sox), one speech model per session,
a real server over the shared model with that speech model, and a real websocket client.

Only one engine may drive the runner at a time: each module starts at most one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
from websockets.asyncio.client import connect

from tests.api.conftest import TIMEOUT, Server
from tests.api.conftest import serve as api_serve
from tests.speech.conftest import SENTENCE, Utterance, synthesise

RATE = 16000
FRAME = 2 * RATE * 20 // 1000  # bytes in 20 ms of PCM16 at 16 kHz: what a microphone client sends
KEY_WORDS = ("kitchen", "light")


@pytest.fixture(scope="session")
def utterance(tmp_path_factory) -> Utterance:
    return synthesise(SENTENCE, tmp_path_factory.mktemp("voice"))


def serve(cfg, runner, stt):
    """The api tests' server, with a loaded speech model handed in too."""
    return api_serve(cfg, runner, stt=stt)


def silence(seconds: float, rate: int = RATE) -> bytes:
    return bytes(2 * round(rate * seconds))


def heard(text: str) -> bool:
    return all(word in text.lower() for word in KEY_WORDS)


class VoiceClient:
    """A websocket client of `/v1/voice` that speaks the protocol in small frames."""

    def __init__(self, ws):
        self.ws = ws

    async def send(self, **message) -> None:
        await self.ws.send(json.dumps(message))

    async def start(self, sample_rate: int = RATE, **settings) -> dict:
        await self.send(type="session.start", sample_rate=sample_rate, **settings)
        ready = await self.event()
        assert ready["type"] == "session.ready", ready
        return ready

    async def audio(self, pcm: bytes, frame: int = FRAME) -> None:
        for i in range(0, len(pcm), frame):
            await self.ws.send(pcm[i:i + frame])

    async def event(self) -> dict:
        return json.loads(await asyncio.wait_for(self.ws.recv(), TIMEOUT))

    async def until(self, *types: str) -> list[dict]:
        """Events up to and including the first of one of `types`."""
        events = []
        while not events or events[-1]["type"] not in types:
            events.append(await self.event())
        return events

    async def ask(self, pcm: bytes) -> list[dict]:
        """Speak an utterance, end it, and read up to its last event."""
        await self.audio(pcm)
        await self.send(type="audio.end")
        return await self.until("response.done", "error")

    async def error(self, code: str) -> dict:
        event = await self.event()
        assert event["type"] == "error" and event["code"] == code, event
        assert event["message"]
        return event


@contextlib.asynccontextmanager
async def voice_client(server: Server, query: str = "", **kwargs):
    url = server.url.replace("http://", "ws://") + "/v1/voice" + query
    async with connect(url, open_timeout=TIMEOUT, **kwargs) as ws:
        yield VoiceClient(ws)


async def poll(predicate, timeout: float = 30.0):
    """Poll until `predicate()` is truthy; its last value (a generous bound, not a timing check)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.02)


def voice_idle(server: Server) -> bool:
    """No voice sequence running or queued, and no KV cells or sequence ids held."""
    state = server.program.engine.state()
    voice = state.lanes["voice"]
    return voice.running == 0 and voice.queued == 0 and state.total("cells_used") == 0 and state.total("seqs_used") == 0
