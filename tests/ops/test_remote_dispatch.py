"""Remote lanes against a scripted fake remote: what is forwarded, and every way a remote fails.

homeai runs in-process over the shared runner (for the fallback); the fake remote is a small
Starlette app whose behaviour each request picks with its last message ("ok", "stream",
"drop", "stall", "500", ...).

Run: .venv/bin/python -m pytest tests/ops/test_remote_dispatch.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.api.conftest import TIMEOUT, api_config, serve, wait_for
from tests.ops.conftest import chat, free_port, sse_events

pytestmark = pytest.mark.model


class FakeRemote:
    def __init__(self):
        self.seen: list[tuple[dict, dict]] = []  # (body, headers) of each request
        self.released = threading.Event()  # "hold" and "stall" requests wait for it
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append((body, dict(request.headers)))
        mode = body["messages"][-1]["content"]
        if mode in ("hold", "stall"):
            await self.wait_released()
        if mode in ("500", "401", "400"):
            return JSONResponse({"error": {"message": f"scripted {mode}", "type": "x", "code": "scripted"}},
                                status_code=int(mode))
        if mode in ("stream", "drop", "stall-stream"):
            return StreamingResponse(self.chunks(mode, body), media_type="text/event-stream")
        model = body.get("model", "fake")
        return JSONResponse({"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "remote says hi"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})

    async def wait_released(self) -> None:
        for _ in range(500):
            if self.released.is_set():
                return
            await asyncio.sleep(0.02)

    async def chunks(self, mode: str, body: dict):
        def chunk(delta, finish=None):
            return "data: " + json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                                          "model": body.get("model", "fake"), "choices": [{"index": 0, "delta": delta,
                                                                               "finish_reason": finish}]}) + "\n\n"
        yield chunk({"role": "assistant", "content": ""})
        for word in ("remote ", "streams "):
            yield chunk({"content": word})
        if mode == "drop":
            return  # the connection ends without [DONE]
        if mode == "stall-stream":
            await self.wait_released()
        yield chunk({}, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            yield "data: " + json.dumps({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                                         "model": body.get("model", "fake"), "choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"


@contextlib.contextmanager
def run_fake(fake: FakeRemote):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(fake.app, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started, timeout=30)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        fake.released.set()
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def fake():
    return FakeRemote()


@pytest.fixture(scope="module")
def server(module_tmp, runner, fake):
    nobody = f"http://127.0.0.1:{free_port()}/v1"  # a closed port: connection refused
    with run_fake(fake) as url:
        cfg = api_config(module_tmp, lanes={"chat": {"max_queue": 1}},
                         remote={"chat": {"url": url, "model": "big-model", "api_key": "sekrit", "concurrency": 1,
                                          "timeout_s": 3.0},
                                 "summaries": {"url": nobody, "fallback_local": True},
                                 "embeddings": {"url": nobody}})
        with serve(cfg, runner) as s:
            yield s


def ask(http, content: str, **extra) -> httpx.Response:
    return http.post("/v1/chat/completions", json=chat(content, lane="chat", **extra))


def test_non_streaming_answer_passes_through_with_the_remote_model_key_and_lane(http, fake):
    r = ask(http, "ok", model="whatever-the-client-says")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "remote says hi" and r.json()["model"] == "big-model"
    body, headers = fake.seen[-1]
    assert body.get("model", "fake") == "big-model" and "lane" not in body
    assert headers["authorization"] == "Bearer sekrit" and headers["x-homeai-lane"] == "chat"


def test_stream_is_relayed_and_the_usage_chunk_only_when_asked(http, fake):
    with http.stream("POST", "/v1/chat/completions", json=chat("stream", stream=True)) as r:
        events = sse_events(r.iter_lines())
    assert r.headers["content-type"].startswith("text/event-stream")
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == "remote streams " and events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == "[DONE]"
    assert fake.seen[-1][0]["stream_options"] == {"include_usage": True}  # asked for the fair-share bill
    with http.stream("POST", "/v1/chat/completions",
                     json=chat("stream", stream=True, stream_options={"include_usage": True})) as r:
        events = sse_events(r.iter_lines())
    assert events[-2]["usage"]["completion_tokens"] == 2 and events[-2]["choices"] == []


def test_a_dropped_stream_still_ends_cleanly(http):
    with http.stream("POST", "/v1/chat/completions", json=chat("drop", stream=True)) as r:
        events = sse_events(r.iter_lines())
    finish, error, done = events[-3:]
    assert finish["id"] == "chatcmpl-fake" and finish["choices"][0]["finish_reason"] == "error"
    assert error["error"]["code"] == "remote_failed" and "ended the stream early" in error["error"]["message"]
    assert done == "[DONE]"


def test_a_silent_remote_is_504_and_a_stalled_stream_ends_with_remote_timeout(http):
    r = ask(http, "stall")
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "remote_timeout" and r.json()["error"]["type"] == "server_error"
    assert "did not answer within 3 s" in r.json()["error"]["message"]
    with http.stream("POST", "/v1/chat/completions", json=chat("stall-stream", stream=True)) as r:
        events = sse_events(r.iter_lines())
    assert events[-3]["choices"][0]["finish_reason"] == "error"
    assert events[-2]["error"]["code"] == "remote_timeout" and events[-1] == "[DONE]"


@pytest.mark.parametrize("mode, status, code", [("500", 502, "remote_error"), ("401", 502, "remote_auth_failed")])
def test_remote_failures_are_502_naming_the_lane_and_url(http, mode, status, code):
    r = ask(http, mode)
    assert r.status_code == status and r.json()["error"]["code"] == code
    message = r.json()["error"]["message"]
    assert "chat lane's remote (http://127.0.0.1:" in message and f"scripted {mode}" in message


def test_a_client_error_from_the_remote_is_relayed_as_it_came(http):
    r = ask(http, "400")
    assert r.status_code == 400 and r.json()["error"]["message"] == "scripted 400"


def test_unreachable_remote_is_502_or_answered_locally_with_fallback(http, server):
    r = http.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 502 and r.json()["error"]["code"] == "remote_unavailable"
    assert "embeddings lane's remote" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json=chat("Say hi.", lane="summaries", max_tokens=4, model="big-model"))
    assert r.status_code == 200 and r.json()["model"] == server.program.model_id("generate")  # the local model
    remote = http.get("/api/lanes").json()["lanes"]["summaries"]["remote"]
    assert remote["fallbacks"] == 1 and remote["failures"] == 1 and remote["fallback_local"] is True


def test_the_lane_queue_bounds_remote_work_and_a_client_leaving_frees_its_place(http, server, fake):
    # concurrency 1 and lanes.chat.max_queue 1: one in flight, one waiting, the next refused
    answers = []
    held = threading.Thread(target=lambda: answers.append(ask_alone(server.url, "hold")))
    held.start()
    assert wait_for(lambda: lanes_remote(http)["running"] == 1)
    with httpx.Client(base_url=server.url, timeout=2.0) as impatient:  # waits, then leaves
        with pytest.raises(httpx.ReadTimeout):
            ask(impatient, "ok")
    assert wait_for(lambda: lanes_remote(http)["queued"] == 0)
    waiting = threading.Thread(target=lambda: answers.append(ask_alone(server.url, "ok")))
    waiting.start()
    assert wait_for(lambda: lanes_remote(http)["queued"] == 1)
    refused = ask(http, "ok")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert refused.headers["retry-after"] and lanes_remote(http)["rejected"] == 1
    fake.released.set()
    held.join(60)
    waiting.join(60)
    assert [r.status_code for r in answers] == [200, 200]
    assert wait_for(lambda: lanes_remote(http)["running"] == 0 and lanes_remote(http)["queued"] == 0)


def ask_alone(url: str, content: str) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        return ask(client, content)


def lanes_remote(http) -> dict:
    return http.get("/api/lanes").json()["lanes"]["chat"]["remote"]
