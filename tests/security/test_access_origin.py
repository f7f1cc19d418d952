"""Web pages against a household server with auth off (loopback only, every caller the admin):
no cross-site writes, and no answers to a name the server is not known by (DNS rebinding).
A real server, real HTTP requests with the headers a browser would send, and real WebSocket
handshakes over a plain socket (to send any Host).

Run: .venv/bin/python -m pytest tests/security/test_access_origin.py
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx
import pytest

from tests.api.conftest import TIMEOUT, api_config, serve

pytestmark = pytest.mark.model

EVIL = "http://evil.example"
KITCHEN = "http://kitchen.local:3000"  # a configured cors origin


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, server={"cors_origins": [KITCHEN], "allowed_hosts": ["homeai.lan"]})


@pytest.fixture(scope="module")
def server(cfg, runner):
    with serve(cfg, runner) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    """A client without a token: with auth off, the household admin."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        yield client


def port(server) -> int:
    return urlsplit(server.url).port


def own_origin(server) -> str:
    return f"http://127.0.0.1:{port(server)}"


def error_code(response) -> str:
    return response.json()["error"]["code"]


@pytest.mark.parametrize("method, path", [("POST", "/api/jobs/index/run"), ("POST", "/v1/chat/completions"),
                                          ("POST", "/api/conversations"), ("DELETE", "/api/conversations/1"),
                                          ("PATCH", "/api/conversations/1")])
def test_a_page_of_another_site_changes_nothing(http, method, path):
    r = http.request(method, path, headers={"Origin": EVIL}, json={"title": "pwned"})
    assert r.status_code == 403 and error_code(r) == "cross_origin", r.text
    r = http.request(method, path, headers={"Origin": "null"}, json={"title": "pwned"})  # a sandboxed page, a file
    assert r.status_code == 403 and error_code(r) == "cross_origin", r.text


def test_the_servers_own_pages_listed_origins_and_non_browsers_may_write(server, http):
    for headers in ({"Origin": own_origin(server)}, {"Origin": KITCHEN}, {}):
        r = http.post("/api/conversations", headers=headers, json={"title": "ok"})
        assert r.status_code == 201, (headers, r.text)


def test_reads_from_another_site_pass(http):
    # The browser keeps their answers from the page (no CORS header); the server need not refuse them.
    r = http.get("/api/conversations", headers={"Origin": EVIL})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.nip.io:{port}", "homeai.lan.evil"])
def test_an_unknown_host_name_is_refused(server, http, host):
    host = host.format(port=port(server))
    for r in (http.get("/v1/models", headers={"Host": host}),
              http.post("/api/conversations", headers={"Host": host, "Origin": f"http://{host}"}, json={})):
        assert r.status_code == 421 and error_code(r) == "host_not_allowed", (host, r.text)


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "homeai.lan",
                                  "homeai.lan:{port}", "192.168.1.20:{port}", socket.gethostname()])
def test_the_servers_names_and_addresses_are_answered(server, http, host):
    assert http.get("/v1/models", headers={"Host": host.format(port=port(server))}).status_code == 200


def handshake(server, host: str, origin: str | None = None) -> int:
    """The status of a WebSocket handshake to /v1/voice with this Host (and Origin)."""
    lines = ["GET /v1/voice HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    with socket.create_connection(("127.0.0.1", port(server)), timeout=TIMEOUT) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        status = sock.makefile("rb").readline().split()
    return int(status[1])


def test_the_voice_socket_keeps_the_same_rules(server):
    here = f"127.0.0.1:{port(server)}"
    assert handshake(server, here) == 101
    assert handshake(server, here, own_origin(server)) == 101
    assert handshake(server, here, KITCHEN) == 101
    assert handshake(server, here, EVIL) == 403
    assert handshake(server, f"evil.example:{port(server)}", f"http://evil.example:{port(server)}") == 421
