"""The app's lifespan: healthz while the model loads or fails to, and a stopping engine.

Run: .venv/bin/python -m pytest tests/api/test_lifecycle.py
"""

from __future__ import annotations

import threading

import httpx
import pytest

import homeai.llama
from homeai.store.db import current_revision, head_revision, make_engine
from tests.api.conftest import api_config, serve, wait_for


def test_healthz_is_503_while_loading_then_reports_a_failed_load(tmp_path, monkeypatch):
    gate = threading.Event()

    class NoModel:
        def __init__(self, *args, **kwargs):
            gate.wait(60)
            raise RuntimeError("no model here")

    monkeypatch.setattr(homeai.llama, "Runner", NoModel)
    cfg = api_config(tmp_path)
    with serve(cfg) as server, httpx.Client(base_url=server.url) as http:
        r = http.get("/healthz")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert "homeai_model_loaded 0.0" in http.get("/metrics").text
        gate.set()
        assert wait_for(lambda: http.get("/healthz").json()["status"] == "error")
        r = http.get("/healthz")
        assert r.status_code == 503 and "no model here" in r.json()["error"]
    engine = make_engine(cfg.database_url)  # the store was migrated on start
    assert current_revision(engine) == head_revision()
    engine.dispose()


@pytest.mark.model
def test_healthz_ok_once_loaded_and_runner_outlives_the_app(tmp_path, runner):
    with serve(api_config(tmp_path), runner) as server, httpx.Client(base_url=server.url) as http:
        body = http.get("/healthz").json()
        assert body["status"] == "ok" and body["n_ctx"] == runner.info.n_ctx
        assert server.program.engine is not None
    assert server.program.engine._thread is not None and not server.program.engine._thread.is_alive()
    assert runner.tokenize("still open")  # an injected runner is not closed with the app
