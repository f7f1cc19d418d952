"""A real homeai server on a free loopback port, over the session's one loaded model.

Only one engine may drive the runner at a time, so each test module starts at most one
server (module-scoped) and stops it, joined, before the next module's starts. `cfg`, `server`,
`client` and `http` are the defaults; a module overrides the ones it needs otherwise.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass

import httpx
import openai
import pytest
import uvicorn

from homeai.api.app import create_app
from homeai.app import Program
from homeai.config import Config, from_dict
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import ALL_LANES, add_member

# Generous: the box is shared and a step can stall for seconds under load; no test asserts on time.
TIMEOUT = 180.0


def api_config(tmp_dir, **sections) -> Config:
    """A config for tests: a SQLite file in `tmp_dir`, with the given sections on top."""
    raw = {"database": {"url": f"sqlite:///{tmp_dir / 'homeai.db'}"}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return from_dict(raw, "(tests)")


@dataclass
class Server:
    url: str
    app: object  # the FastAPI app: app.state.program (or .runtime, its HTTP side) for what a test must reach inside

    @property
    def runtime(self):
        return self.app.state.runtime

    @property
    def program(self):
        return self.app.state.program


@contextlib.contextmanager
def serve(cfg, runner=None, **app_kwargs):
    """Run the app over `Program(cfg, runner=runner, **program_kwargs)` (the one assembly: homeai.app) under
    uvicorn in a thread until the block ends."""
    app = create_app(Program(cfg, runner=runner, **app_kwargs))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5,
                            timeout_keep_alive=cfg.server.header_timeout_s)  # as `homeai serve` (http_server)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield Server(f"http://127.0.0.1:{port}", app)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the test server did not stop"


@pytest.fixture(scope="module")
def cfg(module_tmp):
    """The module's config: the defaults over a SQLite file of its own. A module that needs other
    settings defines its own `cfg` (and `server` and `client` follow it)."""
    return api_config(module_tmp)


@pytest.fixture(scope="module")
def server(cfg, runner):
    """The module's daemon over the session's model (a module defines its own for another runner or
    speech models)."""
    with serve(cfg, runner) as running:
        yield running


@pytest.fixture(scope="module")
def client(cfg, server):
    """alice's `openai` client of the module's server."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=add_token(cfg, "alice"), timeout=TIMEOUT,
                       max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def sized_runner():
    """A runner with the default cache sizes (from the model: 8,192 cells, so Open WebUI's 6,600-token
    preamble fits the interactive cache), beside the session's small one."""
    from homeai.app import load_runner
    from tests.conftest import small_config

    loaded = load_runner(small_config(n_ctx=0, interactive_n_ctx=-1), embeddings=False, grammar=False)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def http(server):
    """A plain HTTP client of the module's `server`."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        yield client


def add_token(cfg, name: str, *, admin: bool = False, lanes=ALL_LANES, proxy: bool = False) -> str:
    """A new member's bearer token, written straight into the server's store. The member may use
    every lane unless `lanes` says otherwise (None: a new member's defaults, which leave voice out);
    `proxy`: a trusted proxy (`homeai members add --proxy`)."""
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return add_member(session, name=name, admin=admin, lanes=None if admin else lanes, proxy=proxy)[1]
    finally:
        engine.dispose()


def lanes(http) -> dict:
    return http.get("/api/lanes").json()["lanes"]


def kv(http) -> dict:
    return http.get("/api/lanes").json()["kv"]


def wait_for(predicate, *, timeout=30.0, interval=0.05):
    """Poll until `predicate()` is truthy; its last value (a generous bound, not a timing check)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
