"""A chat prompt too long for the interactive lanes' cache is answered from the main one, streamed
through the `openai` client, while a short chat keeps the interactive cache; a prompt too long for
every cache is the 400 that says how many tokens fit where.

The server's model has an interactive cache of 1,024 cells beside a main one of 4,096 (a box
short of memory, or `model.interactive_n_ctx = 1024` in the config). Where a prompt was read shows
in `/api/lanes`: a finished request's cells stay cached, as a prefix, in the cache that read them.

Run: .venv/bin/python -m pytest tests/api/test_long_prompts.py
"""

from __future__ import annotations

import openai
import pytest

from tests.api.conftest import kv, serve
from tests.conftest import small_config

pytestmark = pytest.mark.model

# About 1,250 tokens: past the interactive cache's 1,024, and four of them past the main one's 4,096.
NOTES = " ".join(f"Note {i}: the {room} lamp number {i} was switched {state} at {i % 12 + 1} o'clock."
                 for i, (room, state) in enumerate((r, s) for r in ("kitchen", "hall", "study", "garden")
                                                   for s in ("on", "off") for _ in range(7)))


@pytest.fixture(scope="module")
def small_interactive_runner():
    """A runner whose interactive cache holds 1,024 cells, beside the session's (4,096)."""
    from homeai.app import load_runner

    cfg = small_config(interactive_n_ctx=1024)
    loaded = load_runner(cfg, embeddings=False, grammar=False)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(cfg, small_interactive_runner):
    with serve(cfg, small_interactive_runner) as running:
        yield running


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_a_prompt_too_long_for_the_interactive_cache_is_answered_from_the_main_one(client, http):
    caches = kv(http)["caches"]
    assert caches["interactive"]["cells_total"] == 1024 and caches["main"]["cells_total"] == 4096
    long = client.chat.completions.create(
        model="homeai", messages=ask(NOTES + " Which lamps in the study were switched on?"), max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = iter(long)
    first = next(c for c in chunks if c.choices and c.choices[0].delta.content)  # its prompt is read: it decodes
    short = client.chat.completions.create(model="homeai", messages=ask("Name a colour."), max_tokens=4,
                                           temperature=0)
    rest = list(chunks)
    usage = next(c.usage for c in rest if c.usage is not None)
    text = first.choices[0].delta.content + "".join(c.choices[0].delta.content or "" for c in rest if c.choices)
    assert 1024 < usage.prompt_tokens < 4096 - 12 and usage.completion_tokens >= 1 and text.strip()
    assert short.choices[0].message.content and short.usage.prompt_tokens < 100
    caches = kv(http)["caches"]  # each finished prompt's cells stay cached where they were read
    assert caches["main"]["cells_cached"] >= usage.prompt_tokens
    assert 0 < caches["interactive"]["cells_cached"] < 100


def test_a_prompt_no_cache_holds_is_refused_saying_how_many_tokens_fit_where(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="homeai", messages=ask(NOTES * 4), max_tokens=4, stream=True)
    message = str(refused.value)
    assert "fit the interactive cache and 4095 the main cache" in message and "1023" in message
    assert refused.value.code == "context_length_exceeded"
