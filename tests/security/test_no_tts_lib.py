"""Speech out is optional: a real `homeai serve` loads piper beside the model and speaks; with piper
not importable it still serves chat, and `/v1/audio/speech` and `homeai doctor` say why there is no
speech out. piper is hidden by a folder first on PYTHONPATH whose `piper` raises ImportError, as a
missing or broken install does.

Run: .venv/bin/python -m pytest tests/security/test_no_tts_lib.py
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.api.conftest import TIMEOUT
from tests.ops.conftest import ROOT, homeai_serve, write_config

pytestmark = pytest.mark.model

BLOCKED = "blocked by the test's PYTHONPATH"
SPEECH = {"model": "tts-1", "voice": "alloy", "input": "Hello from homeai.", "response_format": "wav"}


@pytest.fixture(scope="module")
def hidden_piper(tmp_path_factory):
    """The environment of a process where `import piper` fails."""
    shim = tmp_path_factory.mktemp("shim")
    (shim / "piper").mkdir()
    (shim / "piper" / "__init__.py").write_text(f"raise ImportError({'piper is ' + BLOCKED!r})\n")
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def test_serve_loads_the_voice_and_speaks(tmp_path):
    with homeai_serve(tmp_path) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as http:
        r = http.post("/v1/audio/speech", json=SPEECH)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "audio/wav" and r.content[:4] == b"RIFF" and len(r.content) > 22050


def test_without_piper_chat_serves_and_speech_says_why(tmp_path, hidden_piper):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", hidden_piper["PYTHONPATH"])  # homeai_serve passes os.environ on
        with homeai_serve(tmp_path) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as http:
            chat = http.post("/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
            r = http.post("/v1/audio/speech", json=SPEECH)
    assert chat.status_code == 200, chat.text
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "tts_unavailable" and BLOCKED in error["message"] and "pip install" in error["message"]


def test_doctor_says_why_not(tmp_path, hidden_piper):
    config, _ = write_config(tmp_path)
    done = subprocess.run([sys.executable, "-m", "homeai.cli", "doctor", "--config", str(config)],
                          capture_output=True, text=True, cwd=ROOT, env=hidden_piper, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("speech out"))
    assert "UNAVAILABLE" in line and BLOCKED in line, done.stdout
