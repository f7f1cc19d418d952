"""Fixtures for the adversarial suite: the api and voice tests' real server (uvicorn over the
session's one loaded model and speech model), with auth on, and clients that speak to it as a
member would, through a real HTTP connection and a real websocket.

Only one engine may drive the runner at a time: each module starts at most one server.
"""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
from websockets.sync.client import connect

from tests.api.conftest import TIMEOUT, Server, add_token, api_config
from tests.voice.conftest import serve

SHORT = {"max_tokens": 4}  # every answer a test provokes stays a few tokens long


def security_config(tmp_dir, **server):
    """Auth on, short answers on every lane, and `server` settings on top."""
    return api_config(tmp_dir, auth={"required": True}, server={"max_output_tokens": 4, **server},
                      lanes={"voice": SHORT, "chat": SHORT, "summaries": SHORT})


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return security_config(module_tmp)


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve(cfg, runner, stt) as running:
        yield running


@pytest.fixture(scope="module")
def token(cfg, server) -> str:
    return add_token(cfg, "mallory")


@pytest.fixture(scope="module")
def http(server, token):
    """One keep-alive connection, as a member's client holds it."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=headers) as client:
        yield client


def post_raw(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"Content-Type": "application/json"})


def post_json(http: httpx.Client, path: str, body) -> httpx.Response:
    """POST `body` as JSON written the way any client may write it: non-ASCII as \\u escapes
    (which is how a lone surrogate reaches the server), Infinity and NaN as Python writes them."""
    return post_raw(http, path, json.dumps(body).encode())


def assert_refused(response: httpx.Response, code: str | None = None, param: str | None = None) -> dict:
    """A 400 in OpenAI's error shape with a code (the one given, if given)."""
    assert response.status_code == 400, (response.status_code, response.text[:500])
    error = response.json()["error"]
    assert error["code"] and error["message"], error
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


def ws_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/voice"


@contextlib.contextmanager
def voice_socket(server: Server, token: str | None = None):
    """A real websocket to `/v1/voice`, signed in with the Authorization header when `token` is given."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with connect(ws_url(server), additional_headers=headers, open_timeout=TIMEOUT, close_timeout=5) as ws:
        yield ws


def event(ws, timeout: float = TIMEOUT) -> dict:
    return json.loads(ws.recv(timeout))


def until(ws, *types: str) -> list[dict]:
    """Events up to and including the first of one of `types`."""
    events = []
    while not events or events[-1]["type"] not in types:
        events.append(event(ws))
    return events
