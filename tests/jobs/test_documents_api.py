"""The jobs over HTTP: run an index on demand, search it, and ask a chat to use the documents."""

from __future__ import annotations

import time

import httpx

from tests.api.conftest import TIMEOUT, api_config, serve
from tests.jobs.conftest import write_docs


def test_index_run_search_and_chat_with_documents(runner, tmp_path):
    folder = tmp_path / "docs"
    write_docs(folder, {
        "boiler.md": "# Boiler\nThe boiler pressure should stay between 1.2 and 1.5 bar. Top it up at the filling loop.",
        "garden.txt": "Plant the tomatoes in May after the last frost, in full sun, 60 cm apart.",
    })
    cfg = api_config(tmp_path, jobs={"index_paths": [str(folder)], "summarise": False})
    with serve(cfg, runner) as server, httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        assert http.post("/api/jobs/nope/run").status_code == 404
        r = http.post("/api/jobs/index/run")
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            jobs = http.get("/api/jobs").json()
            last = next(j for j in jobs["jobs"] if j["name"] == "index").get("last_run") or {}
            if last.get("status") in ("done", "failed"):
                break
            time.sleep(0.5)
        assert last["status"] == "done", last
        hits = http.get("/api/search", params={"q": "boiler pressure bar", "k": 2}).json()["results"]
        assert hits and hits[0]["path"].endswith("boiler.md")
        body = {"messages": [{"role": "user", "content": "What pressure should the boiler have?"}],
                "documents": True, "max_tokens": 24, "temperature": 0}
        answer = http.post("/v1/chat/completions", json=body).json()
        assert answer["choices"][0]["message"]["content"]
        assert answer["citations"] and answer["citations"][0]["path"].endswith("boiler.md")
