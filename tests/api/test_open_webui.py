"""Open WebUI 0.12's default chat, as it sends it: the recorded bodies, posted as they are, answer.

Its chat page calls native tools by default and sends its 36 built-in tools with every message
(about 6,600 prompt tokens with SmolLM2's template): more than the interactive cache held before
it was sized from the model (4,096 cells; SmolLM2 was trained on 8,192). The bodies in
tests/fixtures/open_webui/ were recorded from the real page (how: /work/notes/clients.md and the
scripts beside them); the server here has the default cache sizes, so the interactive cache is
sized from the model.

Run: .venv/bin/python -m pytest tests/api/test_open_webui.py
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import api_config, serve
from tests.conftest import small_config

pytestmark = pytest.mark.model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
# Generous, as every bound here: a first read of 6,600 tokens took 10-12 minutes on the shared
# 2-core box while five other sessions ran their tests (about a minute when it is quiet).
TIMEOUT = 1800.0


def body(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.fixture(scope="module")
def sized_runner():
    """A runner with the default cache sizes (from the model), beside the session's small one."""
    from homeai.app import load_runner

    cfg = small_config(n_ctx=0, interactive_n_ctx=-1)
    loaded = load_runner(cfg, embeddings=False, grammar=False)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(module_tmp, sized_runner):
    with serve(api_config(module_tmp), sized_runner) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        yield client


def test_the_default_caches_hold_the_models_training_context(sized_runner):
    info = sized_runner.info
    assert info.interactive_n_ctx == info.n_ctx == info.n_ctx_train == 8192
    assert info.interactive_max_seq_len == 8192
    assert "training context" in info.kv.note


def test_the_recorded_chats_carry_open_webuis_built_in_tools():
    for name in ("ollama_chat.json", "openai_chat.json"):
        chat = json.loads(body(name))
        assert chat["stream"] is True and len(chat["tools"]) == 36, name


@pytest.mark.timeout(TIMEOUT)
def test_ollama_chat_answers_the_recorded_body_streamed(http):
    lines = []
    with http.stream("POST", "/api/chat", content=body("ollama_chat.json"),
                     headers={"Content-Type": "application/json"}) as r:
        assert r.status_code == 200, r.read()
        lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert len(lines) > 1 and lines[-1]["done"] is True
    assert lines[-1]["done_reason"] in ("stop", "length")
    text = "".join(line["message"].get("content", "") for line in lines)
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert text.strip() or calls
    assert lines[-1]["prompt_eval_count"] > 4096  # more than the interactive cache held before


@pytest.mark.timeout(TIMEOUT)
def test_openai_chat_answers_the_recorded_body_streamed(http):
    with http.stream("POST", "/v1/chat/completions", content=body("openai_chat.json"),
                     headers={"Content-Type": "application/json"}) as r:
        assert r.status_code == 200, r.read()
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    text = "".join(d.get("content") or "" for d in deltas)
    calls = [call for d in deltas for call in d.get("tool_calls") or []]
    assert text.strip() or calls
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert finish and finish[-1] in ("stop", "length", "tool_calls")
