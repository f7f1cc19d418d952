"""Limits on what a client controls: messages, max_tokens, body size, sockets per member.

Run: .venv/bin/python -m pytest tests/ops/test_limits.py
"""

from __future__ import annotations

import threading

import pytest

from homeai.api.limits import PerMember, TooMany
from tests.api.conftest import api_config, serve
from tests.ops.conftest import chat


@pytest.fixture(scope="module")
def server(module_tmp, runner):
    short = {"max_tokens": 8}  # a lane's default answer length may not pass the cap (config refuses it)
    cfg = api_config(module_tmp, server={"max_messages": 3, "max_output_tokens": 8, "max_body_bytes": 4096},
                     lanes={"voice": short, "chat": short, "summaries": short})
    with serve(cfg, runner) as s:
        yield s


@pytest.mark.model
def test_too_many_messages_is_400(http):
    body = {"messages": [{"role": "user", "content": "hi"}] * 4, "max_tokens": 2}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "too_many_messages" and error["param"] == "messages"
    assert "4 messages, more than the 3" in error["message"] and "server.max_messages" in error["message"]


@pytest.mark.model
@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", chat(max_tokens=9), "max_tokens"),
    ("/v1/chat/completions", chat(max_completion_tokens=1000), "max_completion_tokens"),
    ("/v1/completions", {"prompt": "Once", "max_tokens": 10**9}, "max_tokens"),
])
def test_max_tokens_over_the_cap_is_400(http, path, body, param):
    r = http.post(path, json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "max_tokens_too_large" and error["param"] == param
    assert "server.max_output_tokens" in error["message"]


@pytest.mark.model
def test_at_the_caps_it_answers(http):
    body = {"messages": [{"role": "user", "content": "hi"}] * 3, "max_tokens": 8}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.model
def test_body_over_the_configured_size_is_413(http):
    r = http.post("/v1/chat/completions", json=chat("x" * 5000))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_sockets_per_member_are_counted_and_released():
    sockets = PerMember(2)
    with sockets.hold("ann"), sockets.hold("ann"):
        with pytest.raises(TooMany, match="ann already has 2 open WebSockets"):
            sockets.acquire("ann")
        with sockets.hold("bob"):
            assert sockets.num_held("bob") == 1
    assert sockets.counts == {}


def test_the_socket_count_holds_across_threads():
    sockets = PerMember(1000)

    def churn():
        for _ in range(500):
            with sockets.hold("ann"):
                pass

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sockets.counts == {}
