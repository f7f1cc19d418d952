"""Which of a client's requests leave the chat lane (issue 54): Open WebUI's background tasks,
recognised by their templates, and nothing a person waits for. The rules alone, on the bodies in
tests/fixtures/open_webui/ (recorded from the page, or made from the package's own templates:
make_fixtures.py); the recorded bodies on a real server are tests/api/test_ollama_forms.py.

Run: .venv/bin/python -m pytest tests/service/test_clients.py
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from homeai.service.clients import TASKS, client_preamble, is_background_task, task_lane, task_of
from homeai.service.rights import Caller

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
OWUI = Caller("owui", False, 1, ("chat", "summaries"), proxy=True, user="alice")
ONLY_CHAT = Caller("kid", False, 2, ("chat",))
# The background tasks' bodies: recorded from the page (title, tags, follow-ups on both
# connections) and made from the templates (search queries and autocompletion are off by default)
TASK_BODIES = {"title": ("ollama_title.json", "openai_title.json"), "tags": ("ollama_tags.json", "openai_tags.json"),
               "follow_ups": ("ollama_follow_ups.json", "openai_follow_ups.json"),
               "queries": ("openai_queries.json",), "autocomplete": ("openai_autocomplete.json",)}


def messages(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))["messages"]


def cfg(lane: str = "summaries"):
    return SimpleNamespace(clients=SimpleNamespace(background_task_lane=lane))


def test_every_known_task_has_a_body_to_test_it_with():
    assert set(TASK_BODIES) == set(TASKS)


@pytest.mark.parametrize("task, name", [(t, n) for t, names in TASK_BODIES.items() for n in names])
def test_each_background_task_is_recognised_and_leaves_the_chat_lane(task, name):
    body = messages(name)
    assert task_of(body[-1]["content"]) == task
    assert task_lane(cfg(), OWUI, "chat", body) == "summaries"


@pytest.mark.parametrize("name", ["ollama_rag.json", "openai_rag.json"])
def test_an_answer_from_retrieved_documents_stays_on_chat(name):
    body = messages(name)
    question = body[-1]["content"]
    assert question.startswith("### Task:") and "<source id=\"1\"" in question  # the retrieval template
    assert task_of(question) is None
    assert task_lane(cfg(), OWUI, "chat", body) == "chat"


@pytest.mark.parametrize("name", ["ollama_chat.json", "openai_chat.json"])
def test_a_users_message_stays_on_chat(name):
    assert task_lane(cfg(), OWUI, "chat", messages(name)) == "chat"


def test_only_a_whole_task_template_counts():
    title = messages("openai_title.json")[-1]["content"]
    assert task_of("  \n" + title) == "title"  # leading space, as a client may write it
    assert task_of(title.replace("<chat_history>", "")) is None  # no chat quoted: not a task template
    assert task_of("### Task: tags") is None
    assert task_of("What is a ### Task: heading?\n<chat_history>") is None
    assert task_of(title.replace("### Task:", "### Tasks:")) is None


def test_where_a_task_is_found_in_the_conversation():
    title = messages("openai_title.json")[-1]
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert is_background_task([*chat, title])
    assert is_background_task([{"role": "system", "content": title["content"]}, *chat])
    parts = [{"role": "user", "content": [{"type": "text", "text": title["content"]}]}]  # OpenAI's content parts
    assert is_background_task(parts)
    assert not is_background_task([title, *chat, {"role": "user", "content": "Thanks"}])  # an older turn: not asked now


def test_the_task_rule_honours_the_setting_and_the_members_lanes():
    task = messages("openai_tags.json")
    assert task_lane(cfg(""), OWUI, "chat", task) == "chat"  # the rule switched off
    assert task_lane(cfg(), ONLY_CHAT, "chat", task) == "chat"  # a lane the member may not use
    assert task_lane(cfg(), OWUI, "voice", task) == "voice"  # only the chat lane's requests move
    assert task_lane(cfg(), OWUI, "summaries", messages("openai_chat.json")) == "summaries"  # asked there by name


@pytest.mark.parametrize("task, name", [(t, n) for t, names in TASK_BODIES.items() for n in names[:1]])
def test_a_streamed_answer_stays_on_chat_whatever_its_prompt(task, name):
    """Open WebUI asks its tasks with `stream: false`; anything streamed is read as it is written."""
    body = messages(name)
    assert task_lane(cfg(), OWUI, "chat", body, streamed=True) == "chat"
    assert task_lane(cfg(), OWUI, "chat", body, streamed=False) == "summaries"


# ---- what a proxy's users share: the client's preamble ------------------------------------------------


def sharing(system_text: bool):
    return SimpleNamespace(clients=SimpleNamespace(proxy_system_text_shared=system_text))


@pytest.mark.parametrize("name", ["ollama_chat.json", "openai_chat.json"])
def test_open_webuis_default_chat_has_a_client_preamble_its_tools(name):
    assert client_preamble(sharing(False), messages(name))  # no system message: its 36 tools lead the prompt


def test_a_leading_system_message_is_the_clients_only_when_the_config_says_so():
    """Open WebUI puts a user's own System Prompt and Memory in the system message: shared, another user
    could read them back through cached_tokens, so by default such a prompt has no client part."""
    chat = [{"role": "system", "content": "Ana's notes: the safe code is 4831."}, {"role": "user", "content": "Hi"}]
    assert not client_preamble(sharing(False), chat)
    assert client_preamble(sharing(True), chat)
    later = [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Later."}]
    assert client_preamble(sharing(False), later)  # (a system message after a user's turn is that user's anyway)


def test_documents_a_question_chose_make_no_preamble():
    assert not client_preamble(sharing(True), [{"role": "user", "content": "Hi"}], documents=True)
