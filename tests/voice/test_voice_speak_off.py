"""A server without speech synthesis (tts.enabled = false): a session asking to speak is refused
with `tts_unavailable` saying why, and sessions that do not speak are answered as before.

Run: .venv/bin/python -m pytest tests/voice/test_voice_speak_off.py
"""

from __future__ import annotations

import pytest

from tests.api.conftest import api_config
from tests.voice.conftest import heard, serve, voice_client

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, lanes={"voice": {"max_tokens": 8}}, tts={"enabled": False})


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve(cfg, runner, stt) as running:
        yield running


async def test_speaking_is_refused_and_words_still_answer(server, utterance):
    async with voice_client(server) as client:
        await client.send(type="session.start", sample_rate=16000, speak=True)
        error = await client.error("tts_unavailable")
        assert "tts.enabled" in error["message"]
        ready = await client.start(speak=False)
        assert ready["speak"] is False and "voice" not in ready
        events = await client.ask(utterance.raw_16k)
        assert heard(events[0]["text"]) and events[-1]["type"] == "response.done"
        assert set(events[-1]["timings"]) == {"stt_ms", "ttft_ms", "total_ms"}  # as before: no audio, no first_audio_ms
        assert not any(e["type"].startswith("response.audio") for e in events)
