"""Open WebUI's preamble read once for all its users (issue 54), over real HTTP with the `openai` package.

Open WebUI sits in front of homeai as one trusted proxy member and names each person in
`X-OpenWebUI-User-Id`; it sends its 36 built-in tools with every message (the recorded body,
tests/fixtures/open_webui/openai_chat.json: about 6,600 prompt tokens, a few of them the user's).
The first user's chat reads them all; the second user's first chat finds the client's part in the
cache and reads only its own message: `usage.prompt_tokens_details.cached_tokens` is exactly the
client's prefix (the tools and the template's text before the user's turn), never more.

Run: .venv/bin/python -m pytest tests/api/test_proxy_preamble.py
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from homeai.service import prompts
from tests.api.conftest import add_token, api_config, serve
from tests.conftest import small_config

pytestmark = pytest.mark.model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
USER_HEADER = "X-OpenWebUI-User-Id"
# Generous, as in test_open_webui.py: a first read of 6,600 tokens took 10-12 minutes on the shared
# 2-core box while five other sessions ran their tests (about a minute when it is quiet).
TIMEOUT = 1800.0


@pytest.fixture(scope="module")
def sized_runner():
    """A runner with the default cache sizes (8,192 cells: the preamble fits the interactive cache)."""
    from homeai.app import load_runner

    cfg = small_config(n_ctx=0, interactive_n_ctx=-1)
    loaded = load_runner(cfg, embeddings=False, grammar=False)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True})


@pytest.fixture(scope="module")
def server(cfg, sized_runner):
    with serve(cfg, sized_runner) as running:
        yield running


@pytest.fixture(scope="module")
def owui(cfg, server) -> str:
    return add_token(cfg, "owui", proxy=True)


def user(server, token: str, name: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0,
                         default_headers={USER_HEADER: name})


def recorded(question: str | None = None) -> dict:
    body = json.loads((FIXTURES / "openai_chat.json").read_text())
    if question is not None:
        body["messages"] = [{"role": "user", "content": question}]
    return body


def client_len(runner, body: dict) -> tuple[int, int]:
    """The prompt's tokens and its client prefix, as the service renders the chat (tools in the system
    prompt: SmolLM2's template knows none)."""
    plan = prompts.tool_plan(runner, body["tools"], None)
    tokens = runner.tokenize(prompts.Prompter(runner, plan)(body["messages"]))
    return len(tokens), tokens.client_len


@pytest.mark.timeout(TIMEOUT)
def test_the_second_users_first_chat_reads_only_its_own_text(server, owui, sized_runner):
    first, second = recorded(), recorded("Hello! Which of these tools can plan my week?")
    total, preamble = client_len(sized_runner, second)
    assert preamble > 0.9 * total > 5000, (preamble, total)  # nearly all of it is the client's
    usage = {}
    for name, body in (("ana", first), ("ben", second)):
        with user(server, owui, name) as client:
            reply = client.chat.completions.create(model=body["model"], messages=body["messages"],
                                                   tools=body["tools"], max_tokens=1, temperature=0)
        usage[name] = reply.usage
    assert usage["ana"].prompt_tokens_details.cached_tokens < 100, "the first user reads the preamble"
    ben = usage["ben"]
    assert ben.prompt_tokens == total
    assert ben.prompt_tokens_details.cached_tokens == preamble, \
        "the client's preamble from ana's cells, and none of her message"
    assert ben.prompt_tokens - ben.prompt_tokens_details.cached_tokens < 40, "ben read only his own message"
