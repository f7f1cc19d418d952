"""The adversarial probes of issue 15 (items 3, 5 and 9) against a real server with auth on:
text that is not Unicode, numbers out of range, wrong JSON types, bodies that are not JSON,
the voice socket's session.start, unauthenticated sockets per address, and the API docs.
Each is refused with a 400 (or an `error` event) that has a code; the connection stays usable.

Run: .venv/bin/python -m pytest tests/security/test_input.py
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from websockets.exceptions import ConnectionClosed

from homeai.api import voice
from homeai.api.app import create_app
from homeai.app import Program
from tests.api.conftest import api_config
from tests.security.conftest import (
    assert_refused, event, post_json, post_raw, security_config, until, voice_socket,
)

pytestmark = pytest.mark.model

MAX_UNAUTHENTICATED = 2
LONE = "\ud800"  # a lone surrogate: a str in Python, not encodable as UTF-8
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
PARTS = [{"type": "text", "text": "a" + LONE}]  # content as OpenAI's parts


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return security_config(module_tmp, max_unauthenticated_websockets_per_address=MAX_UNAUTHENTICATED)


@pytest.fixture(scope="module")
def conversation(http) -> int:
    response = http.post("/api/conversations", json={"title": "probes"})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def still_usable(http) -> None:
    """The same keep-alive connection answers the next request."""
    assert http.get("/v1/models").status_code == 200


def closed_with(ws, code: int) -> None:
    with pytest.raises(ConnectionClosed):
        event(ws)
    assert ws.close_code == code, ws.close_code


# ---- item 3: text that is not Unicode ------------------------------------------------

LONE_SURROGATES = [
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": LONE}]}, "messages.0.content"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": PARTS}]},
     "messages.0.content.0.text"),
    ("/v1/chat/completions", {**CHAT, "stop": ["x", LONE]}, "stop.1"),
    ("/v1/completions", {"prompt": LONE, "max_tokens": 1}, "prompt"),
    ("/v1/completions", {"prompt": ["ok " + LONE], "max_tokens": 1}, "prompt.0"),
    ("/v1/embeddings", {"input": LONE}, "input"),
    ("/v1/embeddings", {"input": ["fine", LONE]}, "input.1"),
    ("/api/conversations", {"title": LONE}, "title"),
]


@pytest.mark.parametrize("path,body,param", LONE_SURROGATES, ids=[p for _, _, p in LONE_SURROGATES])
def test_a_lone_surrogate_is_refused(http, path, body, param):
    assert_refused(post_json(http, path, body), "invalid_text", param)
    still_usable(http)


def test_a_lone_surrogate_in_a_conversation_message(http, conversation):
    response = post_json(http, f"/api/conversations/{conversation}/messages", {"content": "hi " + LONE})
    assert_refused(response, "invalid_text", "content")
    assert http.get(f"/api/conversations/{conversation}").json()["messages"] == []  # nothing stored
    still_usable(http)


def test_a_lone_surrogate_in_a_key(http):
    assert_refused(post_json(http, "/v1/embeddings", {"input": "fine", LONE: 1}), "invalid_text")
    still_usable(http)


def test_a_lone_surrogate_on_the_voice_socket(server, token):
    with voice_socket(server, token) as ws:
        for message in ({"type": "session.start", "sample_rate": 16000, "token": LONE},
                        {"type": LONE}, {"type": "session.start", "sample_rate": 16000, "language": LONE}):
            ws.send(json.dumps(message))
            error = event(ws)
            assert error["type"] == "error" and error["code"] == "invalid_text", error
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        assert event(ws)["type"] == "session.ready"  # still usable


# ---- item 5: conversation_id on the voice socket -----------------------------------------

BAD_CONVERSATION_IDS = [2**63, 2**64, -(2**63) - 1, -1, 0, True, 1.5, "1", [1]]


def test_a_conversation_id_out_of_range_on_the_voice_socket(server, token):
    with voice_socket(server, token) as ws:
        for conversation_id in BAD_CONVERSATION_IDS:
            ws.send(json.dumps({"type": "session.start", "sample_rate": 16000, "conversation_id": conversation_id}))
            error = event(ws)
            assert error["type"] == "error" and error["code"] == "invalid_value", (conversation_id, error)
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000, "conversation_id": 2**63 - 1}))
        assert event(ws)["code"] == "conversation_not_found"  # the largest id is looked up, and is not there
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        assert event(ws)["type"] == "session.ready"


# ---- item 9: bodies that are not JSON, numbers out of range, wrong types ---------------------

POST_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/api/conversations"]
NOT_JSON = {
    "invalid_utf8": b'{"messages": [{"role": "user", "content": "caf\xe9 \xff"}]}',
    "deeply_nested": b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nested_objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
}


@pytest.mark.parametrize("path", POST_PATHS)
@pytest.mark.parametrize("kind", NOT_JSON)
def test_a_body_that_is_not_json(http, path, kind):
    assert_refused(post_raw(http, path, NOT_JSON[kind]), "invalid_json")
    still_usable(http)


def test_an_integer_of_thousands_of_digits(http):
    body = b'{"prompt": "Hi", "max_tokens": 1' + b"0" * 5000 + b"}"  # past Python's int parsing limit
    assert_refused(post_raw(http, "/v1/completions", body), "invalid_json")


def test_a_deep_body_within_the_parser_limit(http):
    nested = {"input": json.loads("[" * 500 + "]" * 500)}  # parses, but is no embedding input
    assert_refused(post_json(http, "/v1/embeddings", nested), "invalid_value")


OUT_OF_RANGE = [
    ("/v1/chat/completions", "repeat_penalty", float("inf")),
    ("/v1/chat/completions", "repeat_penalty", float("nan")),
    ("/v1/chat/completions", "repeat_penalty", 1e400),  # valid JSON, infinite as a float
    ("/v1/chat/completions", "temperature", float("nan")),
    ("/v1/chat/completions", "top_p", float("nan")),
    ("/v1/chat/completions", "min_p", float("nan")),
    ("/v1/chat/completions", "top_k", 10**12),
    ("/v1/chat/completions", "top_k", 2**31),
    ("/v1/completions", "top_k", 10**12),
    ("/v1/chat/completions", "seed", 2**70),
    ("/v1/chat/completions", "seed", 2**63),
    ("/v1/completions", "seed", -(2**63) - 1),
]


@pytest.mark.parametrize("path,field,value", OUT_OF_RANGE, ids=[f"{f}={v!r}" for _, f, v in OUT_OF_RANGE])
def test_a_number_out_of_range(http, path, field, value):
    body = {**CHAT} if path.endswith("chat/completions") else {"prompt": "Hi", "max_tokens": 1}
    assert_refused(post_json(http, path, {**body, field: value}), "invalid_value", field)


def test_numbers_at_the_edges_of_their_range(http):
    body = {**CHAT, "top_k": 2**31 - 1, "seed": 2**63 - 1, "repeat_penalty": 1.1}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    body = {"prompt": "Hi", "max_tokens": 1, "seed": -(2**63)}
    assert http.post("/v1/completions", json=body).status_code == 200


WRONG_TYPES = [
    ("/v1/chat/completions", "stream", "yes"),
    ("/v1/chat/completions", "stream", 1),
    ("/v1/chat/completions", "logprobs", "true"),
    ("/v1/chat/completions", "documents", 1),
    ("/v1/chat/completions", "max_tokens", "1"),
    ("/v1/chat/completions", "max_tokens", 1.0),
    ("/v1/chat/completions", "temperature", "0.5"),
    ("/v1/chat/completions", "top_k", True),
    ("/v1/chat/completions", "seed", "42"),
    ("/v1/completions", "stream", "no"),
    ("/v1/completions", "echo", "false"),
    ("/v1/embeddings", "dimensions", "576"),
]


@pytest.mark.parametrize("path,field,value", WRONG_TYPES, ids=[f"{f}={v!r}" for _, f, v in WRONG_TYPES])
def test_a_wrong_type_is_not_coerced(http, path, field, value):
    body = {"chat/completions": CHAT, "/completions": {"prompt": "Hi", "max_tokens": 1},
            "embeddings": {"input": "Hi"}}
    base = next(b for suffix, b in body.items() if path.endswith(suffix))
    assert_refused(post_json(http, path, {**base, field: value}), "invalid_value", field)


def test_a_wrong_type_in_a_conversation_message(http, conversation):
    path = f"/api/conversations/{conversation}/messages"
    assert_refused(post_json(http, path, {"content": "hi", "max_tokens": "2"}), "invalid_value", "max_tokens")
    assert_refused(post_json(http, path, {"content": 42}), "invalid_value", "content")


def test_voice_frames_that_are_not_json_it_takes(server, token):
    with voice_socket(server, token) as ws:
        for frame in ("[" * 100_000 + "]" * 100_000, '{"type": ' + "[" * 100_000 + "]" * 100_000 + "}",
                      '{"type": "session.start", "sample_rate": 1' + "0" * 5000 + "}"):
            ws.send(frame)
            error = event(ws)
            assert error["type"] == "error" and error["code"] == "invalid_json", error
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        assert event(ws)["type"] == "session.ready"


def test_a_session_that_fails_unexpectedly_is_closed_with_1011(server, token, monkeypatch):
    def broken(message):
        raise RuntimeError("a bug")

    monkeypatch.setattr(voice, "parse_settings", broken)
    with voice_socket(server, token) as ws:
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        closed_with(ws, 1011)


# ---- item 9: unauthenticated sockets per address ---------------------------------------------------


def test_unauthenticated_sockets_are_capped_per_address(server, token):
    with voice_socket(server) as first, voice_socket(server) as second:
        with voice_socket(server) as third:
            closed_with(third, 4429)
            assert "unauthenticated" in third.close_reason
        # Signing in frees the address's unit: another socket may wait for its session.start.
        first.send(json.dumps({"type": "session.start", "sample_rate": 16000, "token": token}))
        assert event(first)["type"] == "session.ready"
        with voice_socket(server) as fourth:
            fourth.send(json.dumps({"type": "session.start", "sample_rate": 16000, "token": token}))
            assert event(fourth)["type"] == "session.ready"
        second.send(json.dumps({"type": "session.start", "sample_rate": 16000, "token": token}))
        assert event(second)["type"] == "session.ready"


def test_a_socket_signed_in_from_the_start_is_not_counted(server, token):
    with voice_socket(server) as first, voice_socket(server) as second:
        with voice_socket(server, token) as member:  # over the cap, but signed in with its header
            member.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
            assert until(member, "session.ready", "error")[-1]["type"] == "session.ready"
        for ws in (first, second):
            ws.send(json.dumps({"type": "session.start", "sample_rate": 16000, "token": token}))
            assert event(ws)["type"] == "session.ready"


# ---- item 9: the API docs -------------------------------------------------------------------------


def test_the_api_docs_are_off_by_default(http):
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert http.get(path).status_code == 404, path
    assert http.get("/openapi.json").json()["info"]["title"] == "homeai"


def test_the_api_docs_can_be_turned_on(tmp_path):
    app = create_app(Program(api_config(tmp_path, server={"api_docs": True})))
    client = TestClient(app, base_url="http://localhost")  # no lifespan: no model; a name the server answers to
    assert client.get("/docs").status_code == 200
    assert client.get("/redoc").status_code == 200
