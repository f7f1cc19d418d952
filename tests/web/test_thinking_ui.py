"""A thinking model's answer on the household page, in a real Chromium: its thoughts folded in a
`<details>` apart from the answer, never in the answer's bubble nor stored with it.

The shared SmolLM2 is served with a template that opens `<think>` (tests/fixtures/templates/chatml-think.jinja);
two worked examples in the conversation have it think, close the thought and answer.

Run: .venv/bin/python -m pytest -q tests/web/test_thinking_ui.py
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.api.test_thinking import SHOTS, served_with
from tests.web.conftest import screenshot
from tests.web.test_chat_ui import inject, send, wait_answer_done

pytestmark = [pytest.mark.model, pytest.mark.browser]


def greedy(page) -> None:
    """Every answer from this page greedy, as the examples teach it (the page sends no temperature)."""
    def route(r):
        r.continue_(post_data=json.dumps({**json.loads(r.request.post_data), "max_tokens": 40, "temperature": 0}))
    page.route(re.compile(r"/api/conversations/\d+/(messages|regenerate)$"), route)


def test_thoughts_are_shown_folded_apart_from_the_answer(new_page, api, store, runner):
    with served_with(runner):
        cid = inject(store, "Sums", [(m["role"], m["content"]) for m in SHOTS[:4]], api)
        page = new_page()
        greedy(page)
        page.goto(f"/#c/{cid}")
        expect(page.get_by_test_id("assistant-message")).to_have_count(2)
        send(page, SHOTS[4]["content"])
        answer = wait_answer_done(page)

    thoughts = answer.get_by_test_id("thoughts")
    expect(thoughts).to_have_count(1)
    assert thoughts.get_attribute("open") is None  # folded
    expect(thoughts.locator(".thoughts-text")).to_be_hidden()
    thoughts.locator("summary").click()
    thought = thoughts.locator(".thoughts-text").inner_text().strip()
    said = answer.locator(".bubble").inner_text().strip()
    assert thought and said and thought not in said and "think>" not in thought + said
    screenshot(page, "thoughts-open")

    stored = api.get(f"/api/conversations/{cid}").json()["messages"][-1]
    assert stored["role"] == "assistant" and thought not in stored["content"]
    assert re.sub(r"\s+", " ", stored["content"]).strip() == re.sub(r"\s+", " ", said)
    assert not page.errors and not page.dialogs
