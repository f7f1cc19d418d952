"""Fail fast: when the engine's loop dies, requests in flight end with an error, nothing more is
admitted, `/healthz` says why, and `homeai serve` exits with `EXIT_ENGINE_DIED` so that systemd
restarts it, instead of answering `/healthz` while every request hangs.

Faults are injected in the test process only: a wrapper around the shared runner, a scheduler
method replaced on one engine, or, for the real `homeai serve`, `Runner.run` patched by the
child's own bootstrap code. Nothing a client can reach injects a fault.

Run: .venv/bin/python -m pytest tests/engine/test_fail_fast.py
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import httpx
import pytest

from homeai.api.app import create_app
from homeai.app import Program
from homeai.api.shutdown import EXIT_ENGINE_DIED, make_server
from homeai.config import from_dict
from homeai.engine.engine import MAX_FAILED_STEPS, Engine, EngineStopped, scheduler_limits
from homeai.sched.request import SamplingParams
from lanes import DEFAULT_POLICIES
from tests.api.conftest import TIMEOUT, api_config, wait_for
from tests.conftest import small_config
from tests.ops.conftest import ROOT, Served, chat, wait_healthy, write_config

pytestmark = pytest.mark.model

LONG = SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


class Faulty:
    """The shared runner, except that a step raises on the calls `fails(n)` picks (n counts from 1)."""

    def __init__(self, runner, fails=lambda n: True):
        self._runner, self._fails, self.num_runs = runner, fails, 0

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def run(self, plan):
        self._step()
        return self._runner.run(plan)

    def launch(self, plan):  # a step's first half, where the engine plans ahead (scheduler.plan_ahead)
        self._step()
        return self._runner.launch(plan)

    def _step(self) -> None:
        self.num_runs += 1
        if self._fails(self.num_runs):
            raise RuntimeError("injected fault")


@pytest.fixture
def build(runner):
    engines = []

    def make(runner_=runner) -> Engine:
        engine = Engine(runner_, dict(DEFAULT_POLICIES), scheduler_limits(small_config(), runner.info)).start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def finished(stream, timeout: float = TIMEOUT):
    """The stream's finish event, read without ever blocking past `timeout` (a hang fails the test)."""
    box = []
    reader = threading.Thread(target=lambda: box.extend(stream), daemon=True)
    reader.start()
    reader.join(timeout)
    assert not reader.is_alive(), "the request hung"
    return stream.finished


def test_a_loop_that_dies_ends_the_requests_in_flight_and_admits_nothing_more(build):
    engine = build()
    deaths = []
    engine.on_death.append(deaths.append)
    stream = engine.submit("Tell me a long story.", lane="chat", params=LONG)
    assert wait_for(lambda: stream._items, timeout=TIMEOUT)  # decoding

    def planning_bug(now, hold_background=False):
        raise ZeroDivisionError("a planning bug")

    engine.scheduler.schedule = planning_bug
    finish = finished(stream)
    assert finish.reason == "error" and "a planning bug" in finish.error
    assert "ZeroDivisionError: a planning bug" in engine.failure and deaths == [engine.failure]
    with pytest.raises(EngineStopped, match="a planning bug"):
        engine.submit("Hello?", lane="chat", params=SHORT)
    with pytest.raises(EngineStopped, match="a planning bug"):
        engine.call_in_loop(lambda runner: None, timeout=5)


def test_a_runner_failing_step_after_step_stops_the_engine(build, runner):
    faulty = Faulty(runner)
    engine = build(faulty)
    deaths = []
    engine.on_death.append(deaths.append)
    for n in range(MAX_FAILED_STEPS):  # a failed request's release is a step too: it fails as well
        try:
            stream = engine.submit(f"Question {n}?", lane="chat", params=SHORT)
        except EngineStopped:
            break
        finish = finished(stream)
        assert finish.reason == "error" and "injected fault" in finish.error
    assert wait_for(lambda: engine.failure, timeout=TIMEOUT)
    assert f"{MAX_FAILED_STEPS} steps in a row failed" in engine.failure and deaths == [engine.failure]
    assert faulty.num_runs == MAX_FAILED_STEPS


def test_one_failed_step_fails_its_requests_and_the_engine_serves_on(build, runner):
    engine = build(Faulty(runner, fails=lambda n: n == 1))
    assert finished(engine.submit("First?", lane="chat", params=SHORT)).reason == "error"
    assert finished(engine.submit("Second?", lane="chat", params=SHORT)).reason == "length"
    assert engine.failure is None


def test_the_server_says_why_and_stops_with_a_nonzero_status_when_the_engine_dies(runner, tmp_path):
    cfg = api_config(tmp_path, server={"shutdown_grace_s": 0.0})
    app = create_app(Program(cfg, runner=Faulty(runner)))
    server = make_server(app, cfg, log_level="warning")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    assert wait_for(lambda: server.started, timeout=60)
    health = []
    app.state.runtime.on_fatal.insert(0, lambda reason: health.append(app.state.program.error))
    with httpx.Client(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=TIMEOUT) as http:
        first = ask_until_it_dies(http)
    assert first.status_code == 500 and first.json()["error"]["code"] == "generation_failed"
    thread.join(TIMEOUT)
    sock.close()
    assert not thread.is_alive(), "the server kept serving after the engine died"
    assert server.exit_code == EXIT_ENGINE_DIED
    assert health and "the engine stopped" in health[0] and "steps in a row failed" in health[0]


def ask_until_it_dies(http: httpx.Client) -> httpx.Response:
    """Chat requests one at a time until the server refuses them or is gone; the first answer."""
    answers = []
    for _ in range(MAX_FAILED_STEPS):
        try:
            answers.append(http.post("/v1/chat/completions", json=chat("Hi.", max_tokens=4)))
        except httpx.TransportError:
            break
        if answers[-1].status_code != 500:
            # refused by the engine, or by the server draining after its death: either says why
            error = answers[-1].json()["error"]
            assert answers[-1].status_code == 503 and error["code"] == "engine_stopped", error
            assert "steps in a row failed" in error["message"], error
            break
    return answers[0]


BOOTSTRAP = """
import sys
from homeai.llama import runner

def broken(self, plan):
    raise RuntimeError("injected fault")

runner.Runner.run = runner.Runner.launch = broken  # the fault, injected in this process only
from homeai.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_homeai_serve_exits_non_zero_and_says_why_when_its_engine_dies(tmp_path):
    config, port = write_config(tmp_path)
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", BOOTSTRAP, "serve", "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    served = Served(f"http://127.0.0.1:{port}", proc, tmp_path / "data", log)
    try:
        wait_healthy(served)
        with httpx.Client(base_url=served.url, timeout=TIMEOUT) as http:
            first = ask_until_it_dies(http)
        assert first.status_code == 500 and "injected fault" in first.json()["error"]["message"]
        status = proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = served.output()
    assert status == EXIT_ENGINE_DIED, output
    assert "the engine loop died: EngineBroken" in output and "stopping with exit status 70" in output


def test_a_stop_that_hangs_after_the_engine_died_is_cut_short(monkeypatch):
    from homeai.api import shutdown

    exits = []
    monkeypatch.setattr(shutdown, "FATAL_EXIT_S", 0.0)
    monkeypatch.setattr(shutdown.os, "_exit", exits.append)
    cfg = from_dict({}, "(tests)")
    server = make_server(create_app(Program(cfg)), cfg)
    server.grace_s = 0.0
    server.fatal("the engine stopped: test")
    assert server.should_exit and server.exit_code == EXIT_ENGINE_DIED
    assert wait_for(lambda: exits, timeout=10) == [EXIT_ENGINE_DIED]


def test_a_request_arriving_while_the_server_drains_after_the_engine_died_is_told_why():
    from starlette.testclient import TestClient

    from homeai.api.shutdown import Admission, AdmissionMiddleware

    async def app(scope, receive, send):
        raise AssertionError("a request got past a draining server")

    admission = Admission()
    admission.draining = True
    client = TestClient(AdmissionMiddleware(app, admission))
    assert client.get("/healthz").json()["error"]["code"] == "shutting_down"  # a plain stop
    admission.engine_error = "the engine stopped: 8 steps in a row failed"
    refused = client.post("/v1/chat/completions", json=chat("Hi."))
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    assert refused.json()["error"] | {"code": "engine_stopped", "message": admission.engine_error} == refused.json()["error"]
