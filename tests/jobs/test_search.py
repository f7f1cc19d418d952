"""Search through the jobs API: index on demand, then each distinctive query finds its document first.

Run: .venv/bin/python -m pytest tests/jobs/test_search.py
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from homeai.api import errors
from homeai.api import jobs as jobs_api
from homeai.jobs.service import JobService
from tests.jobs.conftest import TOPICS, jobs_config, work_of, write_docs

pytestmark = pytest.mark.model

QUERIES = {
    "when is the MOT due at the garage": "car.txt",
    "tomatoes basil slugs": "garden.md",
    "how do I feed the sourdough starter": "bread.html",
    "boiler pressure is dropping": "boiler.md",
    "cat vaccination booster": "vet.txt",
    "what is the wifi password": "wifi.pdf",
}


@pytest.fixture
def client(tmp_path, store, make_engine):
    folder = tmp_path / "docs"
    write_docs(folder, TOPICS)
    cfg = jobs_config(tmp_path, index_paths=[str(folder)])
    service = JobService(cfg, work_of(make_engine()), store).start()
    app = FastAPI()
    app.include_router(jobs_api.router)
    errors.install(app)  # the app's error handlers: an ApiError (the service's ServiceError) is no HTTPException
    # What the real app keeps: the runtime (auth reads its config and the store) and the program's job service.
    app.state.runtime, app.state.program = SimpleNamespace(cfg=cfg, sessions=store), SimpleNamespace(jobs=service)
    with TestClient(app) as client:
        yield client
    service.shutdown()


def wait_for_run(client, timeout=300.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get("/api/jobs").json()["jobs"][0]
        if job["last_run"]["status"] != "running" or time.monotonic() > deadline:
            return job["last_run"]
        time.sleep(0.2)


def test_search_finds_the_document_with_the_phrase_first(client):
    started = client.post("/api/jobs/index/run")
    assert started.status_code == 202 and started.json()["run"]["status"] == "running"
    assert client.post("/api/jobs/reindex/run").status_code == 404
    run = wait_for_run(client)
    assert run["status"] == "done" and run["items_done"] == len(TOPICS)
    assert client.get("/api/jobs").json()["documents"]["indexed"] == len(TOPICS)

    for query, expected in QUERIES.items():
        response = client.get("/api/search", params={"q": query, "k": 3})
        assert response.status_code == 200
        results = response.json()["results"]
        assert results[0]["path"].endswith("/" + expected), (query, [r["path"] for r in results])
        assert results[0]["score"] > 0 and results[0]["snippet"]

    service = client.app.state.program.jobs
    system, citations = asyncio.run(service.build_document_context("the boiler pressure dropped", k=2))
    assert citations[0]["n"] == 1 and citations[0]["path"].endswith("/boiler.md")
    assert "[1]" in system and "1.5 bar" in system
