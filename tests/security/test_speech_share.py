"""Speech out shared like the model (issue 55, point 3): alice holds eight `/v1/audio/speech` read-
alouds open and reads none of them (a slow reader holds her slots as long as she likes), and still
carol's spoken answer on the voice socket, bob's `/v1/audio/speech` through the `openai` client and
Home Assistant's Wyoming synthesis all get their audio, while alice's ninth is a 429 `tts_busy`
naming her cap (`tts.max_pending_per_member`), with `Retry-After`.

A real server (auth on) over the session's model, speech model and piper voice. Nothing here is
timed: each of alice's texts is some fifty sentences, which the one synthesis worker cannot finish
within the test, so her slots are held throughout by construction.

Run: .venv/bin/python -m pytest tests/security/test_speech_share.py
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import wave

import httpx
import openai
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize

from homeai.store.members import ALL_LANES
from tests.api.conftest import TIMEOUT, add_token, api_config, serve, wait_for
from tests.voice.conftest import utterance, voice_client  # noqa: F401 (fixture)

pytestmark = pytest.mark.model

READ_ALOUD = " ".join(f"This is sentence number {n} of a long story about the old garden by the river."
                      for n in range(1, 50))  # under tts.max_chars (4000)
BOB_SAID = "The porch light is on."


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, lanes={"voice": {"max_tokens": 32}},
                      wyoming={"enabled": True, "port": 0, "member": "ha"})


@pytest.fixture(scope="module")
def server(cfg, runner, stt, tts):
    with serve(cfg, runner, stt=stt, tts=tts) as running:
        yield running


@pytest.fixture(scope="module")
def tokens(cfg, server) -> dict[str, str]:
    """alice and bob: a new member's lanes (no voice); carol and ha (Wyoming's member): every lane."""
    return {"alice": add_token(cfg, "alice", lanes=None), "bob": add_token(cfg, "bob", lanes=None),
            "carol": add_token(cfg, "carol", lanes=ALL_LANES), "ha": add_token(cfg, "ha", lanes=ALL_LANES)}


def speech_client(server, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0)


@contextlib.contextmanager
def held_read_alouds(server, token: str, count: int):
    """`count` read-alouds opened (each answered 200 once its first sentence is made) and never read."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}) as http, \
            contextlib.ExitStack() as held:
        for _ in range(count):
            response = held.enter_context(http.stream("POST", "/v1/audio/speech", json={
                "model": "tts-1", "voice": "alloy", "input": READ_ALOUD, "response_format": "pcm"}))
            assert response.status_code == 200, response.read()
        yield


def test_a_member_holding_eight_read_alouds_holds_back_nobody_but_herself(server, tokens, tts, utterance, stt):
    cap = tts.admission.max_pending_per_member
    assert cap == 8  # the eight streams are exactly one member's share by default
    with held_read_alouds(server, tokens["alice"], cap):
        assert tts.pending_of("alice") == cap
        # carol's spoken answer on the voice socket: audio, no tts_busy.
        spoken, done = asyncio.run(voice_turn(server, tokens["carol"], utterance))
        assert "error" not in done and spoken, done
        # bob's read-aloud through the openai client: a WAV with his words in it.
        audio = speech_client(server, tokens["bob"]).audio.speech.create(model="tts-1", voice="alloy", input=BOB_SAID)
        with wave.open(io.BytesIO(audio.content)) as w:
            pcm, rate = w.readframes(w.getnframes()), w.getframerate()
        assert len(pcm) > rate  # half a second of audio at least
        assert "porch" in stt.transcribe_pcm16(pcm, rate).text.lower()
        # Home Assistant's synthesis over Wyoming (acting as ha): audio too.
        assert len(asyncio.run(wyoming_synthesis(server, "The front door is locked."))) > rate
        # alice's ninth: 429 tts_busy naming her cap, with Retry-After; nothing held for it.
        with pytest.raises(openai.RateLimitError) as refused:
            speech_client(server, tokens["alice"]).audio.speech.create(model="tts-1", voice="alloy", input=BOB_SAID)
        error = refused.value.response.json()["error"]
        assert error["code"] == "tts_busy" and f"tts.max_pending_per_member = {cap}" in error["message"], error
        assert refused.value.response.headers["retry-after"] == "1"
        assert tts.pending_of("alice") == cap
    # Her read-alouds closed, their slots are given back and she is served again.
    assert wait_for(lambda: tts.num_pending == 0, timeout=120), tts.num_pending
    assert speech_client(server, tokens["alice"]).audio.speech.create(model="tts-1", voice="alloy",
                                                                      input="Hello again.").content[:4] == b"RIFF"


async def voice_turn(server, token: str, said) -> tuple[int, dict]:
    """One spoken question on the voice socket with `speak`: the bytes of audio that came back and
    the `response.audio.done` event."""
    async with voice_client(server, additional_headers={"Authorization": f"Bearer {token}"}) as client:
        await client.start(speak=True)
        await client.audio(said.raw_16k)
        await client.send(type="audio.end")
        spoken, audio_done = 0, None
        while True:
            message = await asyncio.wait_for(client.ws.recv(), TIMEOUT)
            if isinstance(message, bytes):
                spoken += len(message)
                continue
            event = json.loads(message)
            if event["type"] == "response.audio.done":
                audio_done = event
            if event["type"] in ("response.done", "error"):
                assert event["type"] == "response.done", event
                return spoken, audio_done


async def wyoming_synthesis(server, text: str) -> bytes:
    """`synthesize` as Home Assistant sends it: the audio between audio-start and audio-stop."""
    async with AsyncTcpClient("127.0.0.1", server.app.state.wyoming.port) as client:
        await client.write_event(Synthesize(text=text).event())
        pcm = bytearray()
        while True:
            event = await asyncio.wait_for(client.read_event(), TIMEOUT)
            assert event is not None and not Error.is_type(event.type), event
            if AudioChunk.is_type(event.type):
                pcm += AudioChunk.from_event(event).audio
            elif AudioStop.is_type(event.type):
                return bytes(pcm)
            else:
                assert AudioStart.is_type(event.type), event
