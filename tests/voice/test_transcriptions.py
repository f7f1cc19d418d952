"""`POST /v1/audio/transcriptions` through the `openai` client, on the same synthesised speech.

Run: .venv/bin/python -m pytest tests/voice/test_transcriptions.py
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.conftest import TIMEOUT, api_config
from tests.voice.conftest import heard, serve

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(module_tmp, runner, stt):
    with serve(api_config(module_tmp), runner, stt) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="any", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        yield c


def test_json(client, utterance):
    result = client.audio.transcriptions.create(model="whisper-1", file=("question.wav", utterance.wav_16k))
    assert heard(result.text)


def test_text(client, utterance):
    text = client.audio.transcriptions.create(model="whisper-1", file=("question.wav", utterance.wav_22k),
                                              response_format="text", language="en")
    assert isinstance(text, str) and heard(text)


def test_verbose_json(client, utterance):
    result = client.audio.transcriptions.create(model="whisper-1", file=("question.wav", utterance.wav_16k),
                                                response_format="verbose_json")
    assert heard(result.text) and result.language == "en"
    assert result.duration > 1.0 and result.duration < 4.0
    assert result.segments and heard(" ".join(s.text for s in result.segments))
    assert all(0 <= s.start < s.end <= result.duration + 0.5 for s in result.segments)


def test_not_audio_is_400(client, http):
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(model="whisper-1", file=("notes.wav", b"this is not audio at all"))
    assert refused.value.status_code == 400
    r = http.post("/v1/audio/transcriptions", files={"file": ("notes.wav", b"RIFF....WAVEjunk", "audio/wav")},
                  data={"model": "whisper-1"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "invalid_audio" and error["type"] == "invalid_request_error" and error["param"] == "file"
    assert error["message"]


def test_missing_file_and_unknown_format_are_400(http, utterance):
    r = http.post("/v1/audio/transcriptions", data={"model": "whisper-1"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    r = http.post("/v1/audio/transcriptions", files={"file": ("q.wav", utterance.wav_16k, "audio/wav")},
                  data={"response_format": "srt"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
