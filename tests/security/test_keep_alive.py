"""An idle kept-alive connection stays open until the head's deadline (`server.header_timeout_s`,
10 s by default), past the 5 s for which httpx's pools (the `openai` and `ollama` clients, Home
Assistant's integration) keep one. uvicorn's own keep-alive was those same 5 s: the server closed a
connection just as a client sent its next request on it, which the client saw as "Server
disconnected without sending a response" (it failed a test once, under load).

Run: .venv/bin/python -m pytest tests/security/test_keep_alive.py
"""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.ops.conftest import homeai_serve
from tests.security.test_listeners import HEALTHZ, raw_socket, read_response, read_until_closed

pytestmark = pytest.mark.model

CLIENT_POOL_S = 5.0  # httpx's keepalive_expiry: how long a client keeps an idle connection to use again


def test_a_connection_idle_past_a_clients_pool_time_is_still_served_then_closed_at_the_deadline(tmp_path):
    with homeai_serve(tmp_path, server={"header_timeout_s": 8.0}) as served, \
            contextlib.closing(raw_socket(served)) as sock:
        sock.sendall(HEALTHZ)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(CLIENT_POOL_S + 1.0)  # past uvicorn's own 5 s, within the head's deadline
        sock.sendall(HEALTHZ)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        began = time.monotonic()
        assert read_until_closed(sock) == b""  # idle again: closed at the deadline, with nothing sent
        assert time.monotonic() - began > CLIENT_POOL_S
