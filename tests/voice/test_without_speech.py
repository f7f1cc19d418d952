"""A server without a speech model still serves chat; voice and transcriptions say why not.

Run: .venv/bin/python -m pytest tests/voice/test_without_speech.py
"""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import TIMEOUT, api_config
from tests.voice.conftest import serve, voice_client

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def server(module_tmp, runner):
    with serve(api_config(module_tmp), runner, None) as running:
        running.program.stt_error = "speech to text is unavailable: no model (test)"
        yield running


async def test_voice_session_is_refused_with_the_reason(server):
    async with voice_client(server) as client:
        await client.send(type="session.start", sample_rate=16000)
        error = await client.error("speech_unavailable")
        assert "no model (test)" in error["message"]


def test_transcriptions_are_503_and_chat_still_works(server, utterance):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        r = http.post("/v1/audio/transcriptions", files={"file": ("q.wav", utterance.wav_16k, "audio/wav")})
        assert r.status_code == 503 and r.json()["error"]["code"] == "speech_unavailable"
        chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert chat.status_code == 200
