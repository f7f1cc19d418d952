"""Bounded HTTP listener and what it shows (issue 26): a real `homeai serve`, auth on, probed with
raw sockets, `httpx`, the `ollama` client and a websocket.

* A client that does not finish its request line and headers within `server.header_timeout_s`
  is dropped (408 when it had started one); a hundred of them at once too. Heads that come in
  time, kept-alive connections, a long streamed answer and an idle websocket are unaffected.
* Ollama's POST routes read the body as JSON whatever its content type (`curl -d` sends a form's).
* The model file's folders are shown to admins only: other members (and guests) see its name.

Run: .venv/bin/python -m pytest tests/security/test_listeners.py
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import ollama
import pytest
from websockets.sync.client import connect

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.api.conftest import TIMEOUT
from tests.ops.conftest import LONG_ANSWER, ROOT, START_TIMEOUT_S, homeai_serve, write_config

pytestmark = pytest.mark.model

HEADER_TIMEOUT_S = 2.0
HALF_A_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: the head never ends
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with homeai_serve(tmp_path_factory.mktemp("listeners"), auth={"required": True},
                      server={"header_timeout_s": HEADER_TIMEOUT_S,
                              "max_connections_per_address": 256}) as running:  # a hundred half heads at once
        yield running


def new_token(served, name: str, *, admin: bool = False) -> str:
    engine = make_engine(f"sqlite:///{served.db}")
    try:
        with make_sessionmaker(engine)() as session:
            return add_member(session, name=name, admin=admin)[1]
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def member(served) -> str:
    return new_token(served, "bob")


@pytest.fixture(scope="module")
def admin(served) -> str:
    return new_token(served, "root", admin=True)


def http_for(served, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=served.url, timeout=TIMEOUT, headers=headers)


def raw_socket(served) -> socket.socket:
    host, port = served.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a read timeout fails the test: it stayed open)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length body, the connection left open."""
    (response,) = read_responses(sock, 1)
    return response


def read_responses(sock: socket.socket, count: int) -> list[bytes]:
    """`count` whole responses with Content-Length bodies, in order, the connection left open.
    Pipelined answers can come in one read, so the bytes past one response begin the next."""
    received, responses = b"", []
    while len(responses) < count:
        response, rest = _split_response(received)
        if response is None:
            received += _more(sock, received)
        else:
            responses.append(response)
            received = rest
    assert not received, f"more came than {count} responses: {received[:200]!r}"
    return responses


def _split_response(data: bytes) -> tuple[bytes | None, bytes]:
    """The first whole response in `data` and what follows it; None while it is not whole yet."""
    head, blank, body = data.partition(b"\r\n\r\n")
    if not blank:
        return None, data
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    if len(body) < length:
        return None, data
    return head + blank + body[:length], body[length:]


def _more(sock: socket.socket, so_far: bytes) -> bytes:
    """The next bytes of a response; the server closing before it is whole fails at once (an
    empty read repeated would spin until the test's timeout)."""
    chunk = sock.recv(65536)
    assert chunk, f"the server closed the connection after {so_far[:200]!r}"
    return chunk


# ---- the request head's deadline ---------------------------------------------------------------


def test_half_a_head_gets_408_and_the_connection_is_closed(served):
    with contextlib.closing(raw_socket(served)) as sock:
        sock.sendall(HALF_A_HEAD)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"server.header_timeout_s" in answer


def test_a_connection_that_sends_nothing_is_closed(served):
    with contextlib.closing(raw_socket(served)) as sock:
        assert read_until_closed(sock) == b""


def test_a_hundred_half_heads_are_all_dropped_and_others_are_served(served, member):
    sockets = [raw_socket(served) for _ in range(100)]
    try:
        for sock in sockets:
            sock.sendall(HALF_A_HEAD)
        with http_for(served, member) as http:  # served meanwhile
            assert http.get("/v1/models").status_code == 200
        answers = [read_until_closed(sock) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), {a[:40] for a in answers}


def test_a_head_that_comes_slowly_but_in_time_is_served(served):
    with contextlib.closing(raw_socket(served)) as sock:
        for piece in (HEALTHZ[:10], HEALTHZ[10:30], HEALTHZ[30:]):
            sock.sendall(piece)
            time.sleep(HEADER_TIMEOUT_S / 8)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")


def test_a_kept_alive_connection_serves_request_after_request(served):
    with contextlib.closing(raw_socket(served)) as sock:
        for _ in range(4):  # together longer than the deadline: each head is timed on its own
            sock.sendall(HEALTHZ)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            time.sleep(HEADER_TIMEOUT_S / 2)
        sock.sendall(HALF_A_HEAD)  # and the next head is timed too
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_pipelined_requests_are_all_answered(served):
    with contextlib.closing(raw_socket(served)) as sock:
        sock.sendall(HEALTHZ * 3)
        answers = read_responses(sock, 3)
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)


def test_a_stream_longer_than_the_deadline_is_not_cut(served, member):
    body = {"messages": [{"role": "user", "content": "Tell me a long story about a cat."}], "stream": True,
            "max_tokens": 12, **LONG_ANSWER}
    started, lines = time.monotonic(), []
    with http_for(served, member) as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                lines.append(line)
                time.sleep(HEADER_TIMEOUT_S / 4)  # a slow reader: the answer outlasts the deadline
    assert lines[-1] == "data: [DONE]", lines
    assert time.monotonic() - started > HEADER_TIMEOUT_S, "the answer did not outlast the deadline"


def test_a_websocket_idle_longer_than_the_deadline_stays_open(served, member):
    url = served.url.replace("http://", "ws://") + "/v1/voice"
    with connect(url, additional_headers={"Authorization": f"Bearer {member}"}, open_timeout=TIMEOUT) as ws:
        time.sleep(2 * HEADER_TIMEOUT_S)
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        event = json.loads(ws.recv(TIMEOUT))
    assert event["type"] in ("session.ready", "error"), event  # answered: the socket was still open
    if event["type"] == "error":
        assert event["code"] != "timeout", event


# ---- Ollama bodies, whatever their content type ----------------------------------------------------


@pytest.fixture(scope="module")
def model(served, member) -> str:
    return ollama.Client(host=served.url, headers={"Authorization": f"Bearer {member}"}).list().models[0].model


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_api_chat_takes_json_sent_the_curl_d_way(served, member, model, content_type):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                       "options": {"num_predict": 3}})
    headers = {"Content-Type": content_type} if content_type else {}
    with http_for(served, member) as http:
        response = http.post("/api/chat", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["done"] is True and response.json()["message"]["role"] == "assistant"


@pytest.mark.parametrize("path, body", [
    ("/api/generate", {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}}),
    ("/api/embed", {"input": "hello"}),
    ("/api/show", {}),
    ("/api/pull", {"stream": False}),
])
def test_every_ollama_post_route_takes_json_as_a_form(served, member, model, path, body):
    with http_for(served, member) as http:
        response = http.post(path, content=json.dumps({"model": model, **body}),
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 200, (path, response.text)


def test_a_form_that_is_not_json_is_a_clear_400(served, member, model):
    with http_for(served, member) as http:
        response = http.post("/api/chat", content=f"model={model}&stream=false",
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 400 and response.json() == {"error": "the body is not valid JSON"}


def test_the_ollama_client_still_works(served, member, model):
    client = ollama.Client(host=served.url, headers={"Authorization": f"Bearer {member}"}, timeout=TIMEOUT)
    reply = client.chat(model=model, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2})
    assert reply.done


# ---- the model file's folders ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(served, admin, model) -> Path:
    """The model file's path, as an admin is shown it."""
    shown = ollama.Client(host=served.url, headers={"Authorization": f"Bearer {admin}"}).show(model)
    path = Path(shown.modelfile.removeprefix("FROM ").strip())
    assert path.is_absolute() and path.is_file(), shown.modelfile
    return path


def test_api_show_gives_a_member_the_file_name_only(served, member, model, model_path):
    shown = ollama.Client(host=served.url, headers={"Authorization": f"Bearer {member}"}).show(model)
    assert shown.modelfile == f"FROM {model_path.name}\n"


@pytest.mark.parametrize("method, path, body", [
    ("GET", "/api/tags", None), ("GET", "/api/ps", None), ("GET", "/v1/models", None), ("GET", "/healthz", None),
    ("GET", "/api/lanes", None), ("GET", "/metrics", None), ("POST", "/api/show", {}),
])
def test_no_answer_names_the_model_folder_to_a_member(served, member, model, model_path, method, path, body):
    with http_for(served, member) as http:
        response = http.request(method, path, json={"model": model, **body} if body is not None else None)
    assert response.status_code == 200, response.text
    assert str(model_path.parent) not in response.text, path


def test_a_model_that_fails_to_load_is_named_without_its_folders(tmp_path):
    """`/healthz` answers anyone: the load error names the file, its folders stay in the log."""
    folder = tmp_path / "home" / "alice" / "models"
    folder.mkdir(parents=True)
    bad = folder / "broken.gguf"
    bad.write_text("not a model")
    config, port = write_config(tmp_path, model={"path": str(bad)})
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "homeai.cli", "serve", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline, body = time.monotonic() + START_TIMEOUT_S, {}
        while body.get("status") != "error" and time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                body = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert body.get("status") == "error", (body, log.read_text())
    assert "broken.gguf" in body["error"] and "alice" not in body["error"], body
    assert str(folder) in log.read_text()  # the admin finds the whole path in the log
