"""Backpressure and every error in OpenAI's shape, on a real server with a tight lane.

The summaries lane here queues at most 2 requests and batches for 10 minutes, so queued
requests stay queued until their clients leave: a third is refused with 429 while the
chat lane keeps answering.

Run: .venv/bin/python -m pytest tests/api/test_errors.py
"""

from __future__ import annotations

import contextlib
import dataclasses

import httpx
import pytest

from homeai.engine.engine import QueueFull
from homeai.engine.state import Latency
from tests.api.conftest import TIMEOUT, api_config, lanes, serve, wait_for

pytestmark = pytest.mark.model

MAX_BODY = 64_000
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(module_tmp, runner):
    cfg = api_config(module_tmp, server={"max_body_bytes": MAX_BODY},
                     lanes={"summaries": {"max_queue": 2, "window_ms": 600_000, "max_batch": 64}})
    with serve(cfg, runner) as running:
        yield running


def assert_error(response: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["message"], error
    assert isinstance(error["type"], str) and error["type"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


def chat(http, **body) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, **body})


def test_flooded_lane_refuses_with_429_while_other_lanes_answer(server, http):
    body = {"messages": HI, "max_tokens": 4, "stream": True}
    with contextlib.ExitStack() as stack, httpx.Client(base_url=server.url, timeout=TIMEOUT) as flood:
        for via in ({"json": {**body, "lane": "summaries"}}, {"json": body, "headers": {"X-HomeAI-Lane": "summaries"}}):
            r = stack.enter_context(flood.stream("POST", "/v1/chat/completions", **via))
            assert r.status_code == 200  # headers sent: the request is queued
        assert lanes(http)["summaries"]["queued"] == 2
        refused = chat(http, lane="summaries")
        error = assert_error(refused, 429, "queue_full", "lane")
        assert error["type"] == "rate_limit_error" and int(refused.headers["Retry-After"]) >= 1
        answered = chat(http)  # the chat lane is not held up
        assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"]
        embedded = http.post("/v1/embeddings", json={"input": "still here"})
        assert embedded.status_code == 200
        state = lanes(http)["summaries"]
        assert state["queued"] == 2 and state["rejected"] == 1
    # the flooding clients left: their queued requests are aborted
    assert wait_for(lambda: lanes(http)["summaries"]["queued"] == 0)
    assert "homeai_rejections_total{lane=\"summaries\"} 1.0" in http.get("/metrics").text


def test_malformed_json_is_400(http):
    r = http.post("/v1/chat/completions", content=b'{"messages": [', headers={"Content-Type": "application/json"})
    assert_error(r, 400, "invalid_json")


@pytest.mark.parametrize("body, param", [
    ({"messages": "hello"}, "messages"),
    ({"messages": HI, "temperature": "hot"}, "temperature"),
    ({"messages": HI, "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
    ({"max_tokens": 3}, "messages"),
    ({"messages": HI, "top_logprobs": 50, "logprobs": True}, "top_logprobs"),
])
def test_wrong_types_and_values_are_400(http, body, param):
    assert_error(http.post("/v1/chat/completions", json=body), 400, "invalid_value", param)


def test_body_that_is_not_an_object_is_400(http):
    assert_error(http.post("/v1/chat/completions", json=[1, 2]), 400)


def test_only_one_choice(http):
    assert_error(chat(http, n=2), 400, param="n")


def test_top_logprobs_needs_logprobs(http):
    assert_error(chat(http, top_logprobs=2), 400, param="top_logprobs")


def test_unknown_lane_is_400(http):
    assert_error(chat(http, lane="garage"), 400, "unknown_lane", "lane")
    r = http.post("/v1/chat/completions", json={"messages": HI}, headers={"X-HomeAI-Lane": "garage"})
    assert_error(r, 400, "unknown_lane")
    assert_error(http.post("/v1/embeddings", json={"input": "x", "lane": "garage"}), 400, "unknown_lane")


def test_unknown_model_is_404_and_aliases_work(http):
    assert_error(chat(http, model="gpt-4o"), 404, "model_not_found", "model")
    assert_error(http.post("/v1/embeddings", json={"input": "x", "model": "nope"}), 404, "model_not_found")
    served = http.get("/healthz").json()["model"]
    for name in (served, served + ".gguf", "homeai", "default"):
        assert chat(http, model=name).json()["model"] == served


def test_prompt_too_long_names_the_sizes(http):
    error = assert_error(chat(http, messages=[{"role": "user", "content": "hello " * 5000}]), 400,
                         "context_length_exceeded", "messages")
    assert "4095" in error["message"]
    error = assert_error(http.post("/v1/completions", json={"prompt": "hello " * 5000}), 400,
                         "context_length_exceeded", "prompt")
    error = assert_error(http.post("/v1/embeddings", json={"input": ["short", "word " * 2000]}), 400,
                         "context_length_exceeded", "input")
    assert "1024" in error["message"]
    assert lanes(http)["embeddings"]["queued"] == 0  # the short one, queued first, was taken back


def test_empty_prompt_is_400(http):
    assert_error(http.post("/v1/completions", json={"prompt": "   "}), 400, param="prompt")
    assert_error(http.post("/v1/embeddings", json={"input": []}), 400, param="input")


def test_body_too_large_is_413(server, http):
    big = {"messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}
    assert_error(http.post("/v1/chat/completions", json=big), 413, "request_too_large")

    def chunked():  # no Content-Length: counted as it arrives
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(MAX_BODY // 1000 + 2):
            yield b"x" * 1000
        yield b'"}]}'

    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as fresh:
        r = fresh.post("/v1/chat/completions", content=chunked(), headers={"Content-Type": "application/json"})
    assert_error(r, 413, "request_too_large")


def test_any_key_is_the_household_with_auth_off(http):
    """OpenAI clients always send a key; with auth off an unknown one is the household member."""
    r = http.get("/v1/models", headers={"Authorization": "Bearer sk-anything"})
    assert r.status_code == 200
    assert http.get("/v1/models").status_code == 200  # no token: the household member too
    r = http.get("/v1/models", headers={"Authorization": "Basic abc"})
    assert_error(r, 401, "invalid_api_key")  # a malformed header is still refused


def test_unknown_route_and_method(http):
    assert_error(http.get("/v1/nothing-here"), 404)
    assert_error(http.get("/v1/chat/completions"), 405)


def test_same_origin_only_by_default(http):
    preflight = http.options("/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in preflight.headers
    r = chat(http, max_tokens=1)
    assert "access-control-allow-origin" not in r.headers


def test_full_queue_asks_every_route_to_wait_the_lanes_time_to_first_token(server, http, monkeypatch):
    """The household chat and the OpenAI route refuse alike: 429, Retry-After from the lane's TTFT."""
    engine = server.program.engine

    def refuse(*_args, lane, **_kwargs):
        raise QueueFull(lane, 1)

    monkeypatch.setattr(engine, "submit", refuse)
    state = engine.state()
    slow = dataclasses.replace(state.lanes["chat"], ttft_ms=Latency(3200.0, 4000.0))
    monkeypatch.setattr(engine, "state", lambda: dataclasses.replace(state, lanes={**state.lanes, "chat": slow}))
    conversation = http.post("/api/conversations", json={"title": "busy"}).json()["id"]
    household = http.post(f"/api/conversations/{conversation}/messages", json={"content": "Hi", "max_tokens": 2})
    openai = chat(http)
    for refused in (household, openai):
        assert_error(refused, 429, "queue_full", "lane")
        assert refused.headers["Retry-After"] == "4", refused.headers  # 3.2 s, rounded up


def test_stopping_engine_is_503(server, http):
    """Last in this module: it stops the engine the server runs."""
    server.program.engine.stop()
    assert_error(chat(http), 503, "engine_stopped")
