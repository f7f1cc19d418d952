"""Speech out switched off (`tts.enabled = false`): `/v1/audio/speech` says why, chat answers on.

Run: .venv/bin/python -m pytest tests/api/test_audio_speech_off.py
"""

from __future__ import annotations

import openai
import pytest

from tests.api.conftest import TIMEOUT, api_config, serve

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(module_tmp, runner):
    with serve(api_config(module_tmp, tts={"enabled": False}), runner) as running:
        yield running


def test_speech_is_503_tts_unavailable_and_chat_still_answers(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="any", timeout=TIMEOUT, max_retries=0)
    with pytest.raises(openai.InternalServerError) as caught:
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.")
    error = caught.value.response.json()["error"]
    assert caught.value.status_code == 503
    assert error["code"] == "tts_unavailable" and "tts.enabled = false" in error["message"]
    chat = client.chat.completions.create(model="homeai", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert chat.choices[0].message.content is not None
