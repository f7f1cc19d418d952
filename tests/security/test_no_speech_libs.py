"""Speech is optional: with PyAV and faster-whisper not importable, a real `homeai serve` still
serves chat, and `/v1/voice`, `/v1/audio/transcriptions` and `homeai doctor` say why speech is
unavailable. The libraries are hidden by a folder first on PYTHONPATH whose `av` and
`faster_whisper` raise ImportError, as a missing or broken install does.

Run: .venv/bin/python -m pytest tests/security/test_no_speech_libs.py
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import wave

import httpx
import pytest

from tests.api.conftest import TIMEOUT
from tests.ops.conftest import ROOT, homeai_serve, write_config
from tests.security.conftest import event, voice_socket

pytestmark = pytest.mark.model

BLOCKED = "blocked by the test's PYTHONPATH"


@pytest.fixture(scope="module")
def hidden_libraries(tmp_path_factory):
    """The environment of a process where `import av` and `import faster_whisper` fail."""
    shim = tmp_path_factory.mktemp("shim")
    (shim / "av.py").write_text(f"raise ImportError({'PyAV is ' + BLOCKED!r})\n")
    (shim / "faster_whisper").mkdir()
    (shim / "faster_whisper" / "__init__.py").write_text(f"raise ImportError({'faster-whisper is ' + BLOCKED!r})\n")
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture(scope="module")
def served(tmp_path_factory, hidden_libraries):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", hidden_libraries["PYTHONPATH"])  # homeai_serve passes os.environ on
        with homeai_serve(tmp_path_factory.mktemp("no_speech")) as running:
            yield running


def wav_of_silence(seconds: float = 0.5, rate: int = 16000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * int(rate * seconds)))
    return out.getvalue()


def test_chat_serves_and_transcriptions_say_why_not(served):
    with httpx.Client(base_url=served.url, timeout=TIMEOUT) as http:
        chat = http.post("/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"] is not None
        r = http.post("/v1/audio/transcriptions", files={"file": ("q.wav", wav_of_silence(), "audio/wav")})
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "speech_unavailable" and BLOCKED in error["message"], error


def test_voice_socket_says_why_not(served):
    with voice_socket(served) as ws:
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        error = event(ws)
    assert error["type"] == "error" and error["code"] == "speech_unavailable", error
    assert BLOCKED in error["message"] and "pip install" in error["message"], error


def test_doctor_says_why_not(tmp_path, hidden_libraries):
    config, _ = write_config(tmp_path)
    done = subprocess.run([sys.executable, "-m", "homeai.cli", "doctor", "--config", str(config)],
                          capture_output=True, text=True, cwd=ROOT, env=hidden_libraries, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    speech = next(line for line in done.stdout.splitlines() if line.startswith("speech model"))
    assert "UNAVAILABLE" in speech and BLOCKED in speech, done.stdout
