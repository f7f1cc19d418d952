"""The household API over a real server with auth on: conversations of the calling member,
answers streamed and stored, member isolation, stop and disconnect abort the sequence, and
the web UI served at `/`.

Run: .venv/bin/python -m pytest tests/api/test_household.py
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import TIMEOUT, add_token, api_config, kv, wait_for

pytestmark = pytest.mark.model

SHORT = {"max_tokens": 12, "temperature": 0}
# Counting keeps this small model going far longer than any test waits for it.
LONG = {"content": "Count from 1 to 1000, one number per line.", "max_tokens": 3000, "temperature": 0}


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True})


@pytest.fixture(scope="module")
def alice(cfg, server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=bearer(add_token(cfg, "alice"))) as client:
        yield client


@pytest.fixture(scope="module")
def bob(cfg, server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=bearer(add_token(cfg, "bob"))) as client:
        yield client


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def new_conversation(client, title: str | None = "test") -> int:
    r = client.post("/api/conversations", json={} if title is None else {"title": title})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def answer(client, path: str, body: dict) -> list[dict]:
    """Every event of a streamed answer."""
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]


def chat_running(client) -> int:
    return client.get("/api/lanes").json()["lanes"]["chat"]["running"]


def test_create_list_rename_get_delete(alice):
    first = new_conversation(alice, "Soup recipes")
    second = new_conversation(alice, None)
    listed = alice.get("/api/conversations").json()["data"]
    assert [c["id"] for c in listed][:2] == [second, first]
    assert listed[1]["title"] == "Soup recipes" and listed[0]["title"] == "New conversation"

    renamed = alice.patch(f"/api/conversations/{first}", json={"title": "  Soups\nand stews "})
    assert renamed.status_code == 200 and renamed.json()["title"] == "Soups and stews"
    got = alice.get(f"/api/conversations/{first}").json()
    assert got["title"] == "Soups and stews" and got["messages"] == []

    assert alice.delete(f"/api/conversations/{first}").status_code == 204
    assert alice.get(f"/api/conversations/{first}").status_code == 404
    assert alice.delete(f"/api/conversations/{first}").status_code == 404
    assert first not in [c["id"] for c in alice.get("/api/conversations").json()["data"]]


def test_bad_bodies_are_400(alice):
    cid = new_conversation(alice)
    assert alice.post(f"/api/conversations/{cid}/messages", json={"content": ""}).status_code == 400
    assert alice.patch(f"/api/conversations/{cid}", json={"title": ""}).status_code == 400
    r = alice.post(f"/api/conversations/{cid}/messages", json={"content": "hi", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_send_streams_the_answer_and_stores_both_sides(alice):
    cid = new_conversation(alice, None)
    events = answer(alice, f"/api/conversations/{cid}/messages", {"content": "Say hello to the family.", **SHORT})
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message.user" and kinds[-1] == "response.done"
    assert set(kinds[1:-1]) == {"response.delta"} and len(kinds) > 2
    streamed = "".join(e["text"] for e in events if e["type"] == "response.delta")
    done = events[-1]
    assert done["finish_reason"] in ("stop", "length") and done["replaces"] == []
    assert done["message"]["role"] == "assistant" and done["message"]["content"] == streamed
    assert 0 < done["usage"]["completion_tokens"] <= SHORT["max_tokens"]

    got = alice.get(f"/api/conversations/{cid}").json()
    assert [(m["role"], m["content"]) for m in got["messages"]] == [
        ("user", "Say hello to the family."), ("assistant", streamed)]
    assert got["messages"][0]["id"] == events[0]["message"]["id"]
    assert got["messages"][1]["output_tokens"] == done["usage"]["completion_tokens"]
    assert got["title"] == "Say hello to the family."  # an untitled conversation takes its first question

    # the history goes into the next prompt: a second answer builds on the first
    events = answer(alice, f"/api/conversations/{cid}/messages", {"content": "And to the cat?", **SHORT})
    assert events[-1]["usage"]["prompt_tokens"] > done["usage"]["prompt_tokens"]
    assert len(alice.get(f"/api/conversations/{cid}").json()["messages"]) == 4


def test_regenerate_replaces_the_last_answer(alice):
    cid = new_conversation(alice)
    first = answer(alice, f"/api/conversations/{cid}/messages", {"content": "Name a fruit.", **SHORT})[-1]
    again = answer(alice, f"/api/conversations/{cid}/regenerate", {"max_tokens": 12, "temperature": 1.0})
    done = again[-1]
    assert done["type"] == "response.done" and done["replaces"] == [first["message"]["id"]]
    assert [e["type"] for e in again][0] == "response.delta"  # no question is stored again
    messages = alice.get(f"/api/conversations/{cid}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1] == done["message"]
    assert messages[1]["created_at"] > first["message"]["created_at"]  # SQLite may reuse the deleted id


def test_regenerate_needs_a_question(alice):
    cid = new_conversation(alice)
    r = alice.post(f"/api/conversations/{cid}/regenerate")
    assert r.status_code == 400 and r.json()["error"]["code"] == "nothing_to_regenerate"


def test_a_member_never_reaches_another_members_conversation(alice, bob, server):
    cid = new_conversation(alice, "Alice's secrets")
    answer(alice, f"/api/conversations/{cid}/messages", {"content": "Hi", **SHORT})
    path = f"/api/conversations/{cid}"
    for method, suffix, body in [("GET", "", None), ("PATCH", "", {"title": "mine now"}), ("DELETE", "", None),
                                 ("POST", "/messages", {"content": "hi"}), ("POST", "/regenerate", None),
                                 ("POST", "/stop", None)]:
        r = bob.request(method, path + suffix, json=body)
        assert r.status_code == 404, (method, suffix, r.text)
        assert r.json()["error"]["code"] == "conversation_not_found"
    assert cid not in [c["id"] for c in bob.get("/api/conversations").json()["data"]]
    got = alice.get(path).json()
    assert got["title"] == "Alice's secrets" and len(got["messages"]) == 2
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as anonymous:
        assert anonymous.get("/api/conversations").status_code == 401
        assert anonymous.get(path).status_code == 401


def test_stop_aborts_the_sequence_and_keeps_the_partial_answer(alice):
    cid = new_conversation(alice)
    with alice.stream("POST", f"/api/conversations/{cid}/messages", json=LONG) as r:
        lines = r.iter_lines()
        events = []
        while sum(e["type"] == "response.delta" for e in events) < 3:
            line = next(lines)
            if line:
                events.append(json.loads(line.removeprefix("data: ")))
        assert chat_running(alice) == 1
        # one answer at a time per conversation
        busy = alice.post(f"/api/conversations/{cid}/messages", json={"content": "hi"})
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "answer_in_progress"

        assert alice.post(f"/api/conversations/{cid}/stop").json() == {"stopped": True}
        events += [json.loads(line.removeprefix("data: ")) for line in lines if line]
    done = events[-1]
    assert done["type"] == "response.done" and done["finish_reason"] == "abort"
    assert done["usage"]["completion_tokens"] < LONG["max_tokens"]
    assert chat_running(alice) == 0 and kv(alice)["seqs_used"] == 0
    stored = alice.get(f"/api/conversations/{cid}").json()["messages"][-1]
    streamed = "".join(e["text"] for e in events if e["type"] == "response.delta")
    assert stored["role"] == "assistant" and stored["content"] == streamed != ""
    assert alice.post(f"/api/conversations/{cid}/stop").json() == {"stopped": False}


def test_closing_the_stream_aborts_the_sequence(alice):
    cid = new_conversation(alice)
    with httpx.Client(base_url=str(alice.base_url), headers=dict(alice.headers), timeout=TIMEOUT) as client:
        with client.stream("POST", f"/api/conversations/{cid}/messages", json=LONG) as r:
            lines = r.iter_lines()
            seen = 0
            while seen < 3:
                seen += '"response.delta"' in next(lines)
            assert chat_running(alice) == 1
        # leaving the block closes the connection mid-answer
    assert wait_for(lambda: chat_running(alice) == 0)
    assert kv(alice)["seqs_used"] == 0

    def stored():
        messages = alice.get(f"/api/conversations/{cid}").json()["messages"]
        return messages if len(messages) == 2 else None
    messages = wait_for(stored)  # the partial answer is kept, as a stop keeps it
    assert messages and messages[1]["role"] == "assistant" and messages[1]["content"]
    # the conversation is free again
    events = answer(alice, f"/api/conversations/{cid}/messages", {"content": "Thanks!", **SHORT})
    assert events[-1]["type"] == "response.done"


def test_deleting_a_conversation_stops_its_answer(alice):
    cid = new_conversation(alice)
    with alice.stream("POST", f"/api/conversations/{cid}/messages", json=LONG) as r:
        lines = r.iter_lines()
        while '"response.delta"' not in next(lines):
            pass
        assert alice.delete(f"/api/conversations/{cid}").status_code == 204
        events = [json.loads(line.removeprefix("data: ")) for line in lines if line]
    assert events[-1]["type"] == "response.done" and events[-1]["message"] is None
    assert wait_for(lambda: chat_running(alice) == 0)


def test_the_web_ui_is_served_at_the_root(server, alice):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as anonymous:
        page = anonymous.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert 'data-testid="message-input"' in page.text
        for path in ("/app.js", "/chat.js", "/markdown.js", "/style.css"):
            r = anonymous.get(path)
            assert r.status_code == 200 and r.text, path
        assert anonymous.get("/app.js").headers["content-type"].startswith("text/javascript")
        assert anonymous.get("/nope.js").status_code == 404
        assert anonymous.get("/healthz").json()["status"] == "ok"  # the UI shadows no API route
