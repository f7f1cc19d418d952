"""Open WebUI 0.12's default chat, as it sends it, through a trusted proxy member (issue 54): the
recorded bodies, posted as they are, answer, and the preamble is read once for all its users.

Its chat page calls native tools by default and sends its 36 built-in tools with every message
(about 6,600 prompt tokens with SmolLM2's template): more than the interactive cache held before
it was sized from the model (4,096 cells; SmolLM2 was trained on 8,192). The bodies in
tests/fixtures/open_webui/ were recorded from the real page (how: the scripts beside them); the
server here has the default cache sizes, so the interactive cache is sized from the model.

Open WebUI sits in front of homeai as one proxy member and names each person in
`X-OpenWebUI-User-Id`. The first user's chat reads the whole preamble; every later user's first
chat finds the client's part in the cache and reads only its own message:
`usage.prompt_tokens_details.cached_tokens` is exactly the client's prefix (the tools and the
template's text before the user's turn), never more. The tests run in order over one server, so
the 6,600 tokens are read once (about a minute when the box is quiet).

Run: .venv/bin/python -m pytest tests/api/test_open_webui.py
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from homeai.service import prompts
from tests.api.conftest import add_token, api_config, serve

pytestmark = pytest.mark.model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
USER_HEADER = "X-OpenWebUI-User-Id"
# Generous, as every bound here: a first read of 6,600 tokens took 10-12 minutes on the shared
# 2-core box while five other sessions ran their tests (about a minute when it is quiet).
TIMEOUT = 1800.0


def body(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.fixture(scope="module")
def cfg(module_tmp):
    """Auth on (a proxy member), and the chat lane's answers capped (`max_tokens`, as a household may
    set it): the recorded bodies ask no length, and a sampled answer read at 7,000 tokens of context
    ran from 10 s to nearly 3 minutes, by its length alone."""
    return api_config(module_tmp, auth={"required": True}, lanes={"chat": {"max_tokens": 32}})


@pytest.fixture(scope="module")
def server(cfg, sized_runner):
    with serve(cfg, sized_runner) as running:
        yield running


@pytest.fixture(scope="module")
def owui(cfg, server) -> str:
    """Open WebUI's token: a trusted proxy (`homeai members add owui --proxy`)."""
    return add_token(cfg, "owui", proxy=True)


def as_user(owui: str, name: str) -> dict:
    return {"Authorization": f"Bearer {owui}", USER_HEADER: name, "Content-Type": "application/json"}


def user(server, owui: str, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=owui, timeout=TIMEOUT, max_retries=0,
                         default_headers={USER_HEADER: name})


def recorded(question: str | None = None) -> dict:
    chat = json.loads(body("openai_chat.json"))
    if question is not None:
        chat["messages"] = [{"role": "user", "content": question}]
    return chat


def client_len(runner, chat: dict) -> tuple[int, int]:
    """The prompt's tokens and its client prefix, as the service renders the chat (tools in the system
    prompt: SmolLM2's template knows none)."""
    plan = prompts.tool_plan(runner, chat["tools"], None)
    tokens = runner.tokenize(prompts.Prompter(runner, plan)(chat["messages"]))
    return len(tokens), tokens.client_len


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
def test_the_second_users_first_chat_reads_only_its_own_text(server, owui, sized_runner):
    first, second = recorded(), recorded("Hello! Which of these tools can plan my week?")
    total, preamble = client_len(sized_runner, second)
    assert preamble > 0.9 * total > 5000, (preamble, total)  # nearly all of it is the client's
    usage = {}
    for name, chat in (("ana", first), ("ben", second)):
        with user(server, owui, name) as client:
            reply = client.chat.completions.create(model=chat["model"], messages=chat["messages"],
                                                   tools=chat["tools"], max_tokens=1, temperature=0)
        usage[name] = reply.usage
    assert usage["ana"].prompt_tokens_details.cached_tokens < 100, "the first user reads the preamble"
    ben = usage["ben"]
    assert ben.prompt_tokens == total
    assert ben.prompt_tokens_details.cached_tokens == preamble, \
        "the client's preamble from ana's cells, and none of her message"
    assert ben.prompt_tokens - ben.prompt_tokens_details.cached_tokens < 40, "ben read only his own message"


@pytest.mark.timeout(TIMEOUT)
def test_ollama_chat_answers_the_recorded_body_streamed(server, owui):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        with http.stream("POST", "/api/chat", content=body("ollama_chat.json"), headers=as_user(owui, "cleo")) as r:
            assert r.status_code == 200, r.read()
            lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert len(lines) > 1 and lines[-1]["done"] is True
    assert lines[-1]["done_reason"] in ("stop", "length")
    text = "".join(line["message"].get("content", "") for line in lines)
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert text.strip() or calls
    assert lines[-1]["prompt_eval_count"] > 4096  # more than the interactive cache held before


@pytest.mark.timeout(TIMEOUT)
def test_openai_chat_answers_the_recorded_body_streamed(server, owui):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        with http.stream("POST", "/v1/chat/completions", content=body("openai_chat.json"),
                         headers=as_user(owui, "dev")) as r:
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
