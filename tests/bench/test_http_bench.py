"""`homeai bench http`: the household workload streamed over HTTP, measured by the client, here against
one real homeai server named twice (a stand-in for homeai beside llama-server), and against a port
where nothing listens.

Run: .venv/bin/python -m pytest tests/bench/test_http_bench.py
"""

from __future__ import annotations

import asyncio
import json

import pytest

from homeai.bench import http_bench
from homeai.bench import workloads
from homeai.bench.workloads import Spec, Workload
from homeai.cli import main
from lanes import DEFAULT_POLICIES
from tests.api.conftest import api_config, serve
from tests.ops.conftest import free_port

pytestmark = pytest.mark.model


def tiny_household(**_params) -> Workload:
    """The household's shape, small enough for a shared 2-core box: a chat, a voice question, a
    document to summarise and an embedding (which the HTTP bench leaves out)."""
    specs = [Spec("chat-0", 0.0, "chat", "m0", 24, 8, group="short"),
             Spec("voice-0", 0.1, "voice", "m1", 16, 6, group="short"),
             Spec("doc-0", 0.0, "summaries", "jobs", 160, 8, group="long"),
             Spec("idx-0", 0.0, "indexing", "jobs", 40, 0, kind="embed")]
    return Workload("household", specs, {"tiny": True})


def test_both_servers_side_by_side_per_phase_and_lane(runner, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(workloads, "household", tiny_household)
    with serve(api_config(tmp_path), runner) as server:
        out = tmp_path / "out"
        status = main(["bench", "http", "--url", server.url, "--peer", server.url + "/v1/", "--peer-name", "again",
                       "--quick", "--out", str(out)])
    assert status == 0
    doc = json.loads((out / "http.json").read_text())
    assert doc["targets"] == {"homeai": server.url + "/v1", "again": server.url + "/v1"}
    for name in ("homeai", "again"):
        idle, loaded = doc["results"][name]["idle"], doc["results"][name]["loaded"]
        assert "summaries" not in idle["lanes"] and "summaries" in loaded["lanes"]
        assert "indexing" not in loaded["lanes"]  # embeddings are left out
        for phase in (idle, loaded):
            for lane, m in phase["lanes"].items():
                assert m["requests"] >= 1 and m["success_rate"] == 1.0 and m["failures"] == [], (name, lane, m)
                assert m["ttft_ms"]["p50"] > 0 and m["e2e_ms"]["p50"] >= m["ttft_ms"]["p50"]
                assert m["itl_ms"]["p50"] is not None
                assert 1.0 <= m["tokens_per_chunk"] < 3.0  # a real model's tokens mostly end on a character
    report = (out / "http.md").read_text()
    assert "| homeai | loaded | chat |" in report and "| again | idle | chat |" in report
    assert "chat TTFT p95 idle" in capsys.readouterr().out


def test_a_server_that_is_not_there_is_counted_as_failed_requests():
    specs = [Spec(f"chat-{i}", 0.0, "chat", "m", 8, 4) for i in range(3)]
    target = http_bench.Target("nobody", http_bench.base_url(f"http://127.0.0.1:{free_port()}"))
    metrics = http_bench.phase_metrics(asyncio.run(http_bench.run_phase(target, Workload("w", specs))),
                                       DEFAULT_POLICIES)
    chat = metrics["lanes"]["chat"]
    assert chat["requests"] == 3 and chat["succeeded"] == 0 and chat["failures"] == ["error: ConnectError"]
    assert chat["ttft_ms"]["p50"] is None and chat["tokens_per_chunk"] is None


def test_prompts_are_ordinary_words_of_the_spec_length_and_repeatable():
    spec = Spec("doc-0", 0.0, "summaries", "jobs", 50, 10, seed=3)
    text = http_bench.prompt_text(spec)
    assert text == http_bench.prompt_text(spec) and text.startswith("Summarise this document:\n")
    assert len(text.split("\n", 1)[1].split()) == 50
    assert http_bench.base_url("http://box:8080") == http_bench.base_url("http://box:8080/v1/") == "http://box:8080/v1"
