"""Every byte from the network is timed and counted (issue 55, point 2): a real `homeai serve`, auth
on, probed with raw sockets from loopback addresses of their own (127.0.0.x: bob, the one asking
for service meanwhile, comes from another address than the guest's).

* A request body that stops, or trickles below `server.body_min_rate`, is answered 408 and closed;
  a slow but steady one is served, however long past `server.body_timeout_s` it takes.
* A route that needs a member answers a request without a valid token 401 from its head, in its
  own shape, without waiting for the body it announced.
* Connections are capped per client address (and in all): one more is closed as it opens, the
  others and other addresses are served, and the refusals make one log line, not one each.
* Should the process run out of files anyway, asyncio's accept errors make one line, not thousands.

Run: .venv/bin/python -m pytest tests/security/test_slow_bodies.py
"""

from __future__ import annotations

import contextlib
import json
import resource
import select
import socket
import time
from pathlib import Path

import httpx
import pytest

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.ops.conftest import homeai_serve

pytestmark = pytest.mark.model

BODY_TIMEOUT_S = 2.0
MIN_RATE = 1000  # bytes a second
PER_ADDRESS = 16
GUEST, BOB = "127.0.0.3", "127.0.0.2"  # loopback addresses of their own: the caps count by address
CLOSED_WITHIN_S = 30.0  # a socket the server should close is given this long: 15x the deadline
HI = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with homeai_serve(tmp_path_factory.mktemp("slow_bodies"), auth={"required": True},
                      server={"body_timeout_s": BODY_TIMEOUT_S, "body_min_rate": MIN_RATE, "max_connections": 200,
                              "max_connections_per_address": PER_ADDRESS}) as running:
        yield running


@pytest.fixture(scope="module")
def bob(served) -> str:
    engine = make_engine(f"sqlite:///{served.db}")
    try:
        with make_sessionmaker(engine)() as session:
            return add_member(session, name="bob")[1]
    finally:
        engine.dispose()


def connect(served, address: str = GUEST) -> socket.socket:
    host, port = served.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=CLOSED_WITHIN_S, source_address=(address, 0))


def bob_client(served, token: str) -> httpx.Client:
    return httpx.Client(base_url=served.url, timeout=120, headers={"Authorization": f"Bearer {token}"},
                        transport=httpx.HTTPTransport(local_address=BOB))


def head(path: str, length: int, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode()


def read_until_closed(sock: socket.socket) -> bytes:
    """What the server sends until it closes (the socket's timeout fails the test: it stayed open)."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def read_response(sock: socket.socket) -> tuple[bytes, dict]:
    """The status line and JSON body of one response with a Content-Length, the connection left open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head_bytes.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail(f"closed after {data + body!r}")
    return head_bytes.split(b"\r\n")[0], json.loads(body)


# ---- the body's deadline --------------------------------------------------------------------------


def test_a_body_that_stops_gets_408_and_is_closed(served, bob):
    with contextlib.closing(connect(served)) as sock:
        sock.sendall(head("/v1/chat/completions", 100, bob) + b"{")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"server.body_timeout_s" in answer


def test_a_trickle_below_the_minimum_rate_is_cut(served, bob):
    """10 bytes every 0.2 s, never silent for the deadline, at a twentieth of the minimum rate."""
    with contextlib.closing(connect(served)) as sock:
        sock.sendall(head("/v1/chat/completions", 100_000, bob) + b"{")
        sent, deadline = 0, time.monotonic() + CLOSED_WITHIN_S
        while not select.select([sock], [], [], 0.2)[0]:
            assert time.monotonic() < deadline, f"{sent} bytes trickled and the body is still read"
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sent += sock.send(b" " * 10)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert sent < 100_000


def test_a_slow_but_steady_upload_is_served(served, bob):
    """64 KB at 8 KB a second, a pause of a quarter of the deadline between pieces: 8 s in all."""
    body = json.dumps(HI).encode() + b" " * 64_000  # JSON may end in whitespace: the model reads "Hi"
    with contextlib.closing(connect(served)) as sock:
        sock.sendall(head("/v1/chat/completions", len(body), bob))
        for start in range(0, len(body), 4000):
            sock.sendall(body[start:start + 4000])
            time.sleep(BODY_TIMEOUT_S / 4)
        status, answer = read_response(sock)
    assert status.startswith(b"HTTP/1.1 200 "), (status, answer)
    assert answer["choices"][0]["message"]["role"] == "assistant"


# ---- auth from the head -----------------------------------------------------------------------


@pytest.mark.parametrize("token, code", [(None, "missing_token"), ("hai_not-a-member", "invalid_api_key")])
def test_a_huge_body_without_a_valid_token_is_401_before_any_of_it(served, token, code):
    with contextlib.closing(connect(served)) as sock:
        sock.sendall(head("/v1/chat/completions", 3_900_000, token))  # the body never comes
        status, answer = read_response(sock)
    assert status.startswith(b"HTTP/1.1 401 "), (status, answer)
    assert answer["error"]["code"] == code and answer["error"]["type"] == "authentication_error", answer


def test_an_ollama_route_answers_its_401_in_its_own_shape(served):
    with contextlib.closing(connect(served)) as sock:
        sock.sendall(head("/api/chat", 3_900_000))
        status, answer = read_response(sock)
    assert status.startswith(b"HTTP/1.1 401 ") and set(answer) == {"error"}, (status, answer)
    assert isinstance(answer["error"], str) and "token" in answer["error"]


def test_after_an_early_401_the_body_is_dropped_and_the_connection_serves_on(served, bob):
    """The body a refused request announced is read and dropped (as it comes, under its deadline),
    and the kept-alive connection then serves the next request."""
    body = json.dumps(HI).encode()
    with contextlib.closing(connect(served)) as sock:
        sock.sendall(head("/v1/chat/completions", len(body)) + body)
        assert read_response(sock)[0].startswith(b"HTTP/1.1 401 ")
        sock.sendall(head("/v1/chat/completions", len(body), bob) + body)
        status, answer = read_response(sock)
    assert status.startswith(b"HTTP/1.1 200 "), (status, answer)


# ---- connections per address ----------------------------------------------------------------------


def served_on(sock: socket.socket) -> bool:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return read_response(sock)[0].startswith(b"HTTP/1.1 200 ")


def test_one_connection_over_the_address_cap_is_closed_while_others_are_served(served, bob):
    log_lines_before = served.output().count("over the caps")
    sockets = [connect(served) for _ in range(PER_ADDRESS)]
    try:
        assert all(served_on(sock) for sock in sockets)  # each is open and answered
        extra = [connect(served) for _ in range(50)]
        for sock in extra:
            with contextlib.closing(sock):
                assert read_until_closed(sock) == b""  # closed before anything was read
        with bob_client(served, bob) as http:  # another address is served meanwhile
            assert http.post("/v1/chat/completions", json=HI).status_code == 200
        assert all(served_on(sock) for sock in sockets)  # and the guest's open connections still are
    finally:
        for sock in sockets:
            sock.close()
    assert _served_anew(served)  # closed, they no longer count
    assert served.output().count("over the caps") - log_lines_before <= 1, "one log line a minute, not one each"


def _served_anew(served) -> bool:
    """A new connection from the guest's address served within a few tries (the server counts a
    connection gone once it has seen it close)."""
    for _ in range(50):
        with contextlib.suppress(OSError, pytest.fail.Exception), contextlib.closing(connect(served)) as sock:
            if served_on(sock):
                return True
        time.sleep(0.1)
    return False


# ---- out of files -------------------------------------------------------------------------------------


def test_accept_errors_for_want_of_files_make_one_log_line(tmp_path):
    """Caps set above the file limit (the limit lowered under a running server), 300 connections:
    asyncio's accept loop fails for want of files, once per connection waiting and again each
    second; one line gets through. Once the connections close, the server serves again."""
    with homeai_serve(tmp_path, server={"max_connections": 5000, "max_connections_per_address": 5000}) as server:
        pid = server.proc.pid
        open_files = len(list(Path(f"/proc/{pid}/fd").iterdir()))
        hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_files + 40, hard))
        sockets = [connect(server) for _ in range(300)]
        try:
            time.sleep(3)  # the accept loop retries every second
        finally:
            for sock in sockets:
                sock.close()
        assert _eventually(lambda: httpx.get(server.url + "/healthz", timeout=5).status_code == 200)
        lines = server.output().count("socket.accept() out of system resource")
    assert lines == 1, f"{lines} accept error lines"


def _eventually(check) -> bool:
    for _ in range(100):
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return True
        time.sleep(0.1)
    return False
