"""A second homeai on another loopback port serves the `summaries` lane of the first.

Two real `homeai serve` processes, each with its own model copy: "big" (the remote) and
"home" (with `[remote.summaries]` pointing at big, and `[remote.embeddings]` too, falling back
to its own model). Streaming and non-streaming pass through; stopping big gives clear errors,
and the lane that may fall back answers locally.

Run: .venv/bin/python -m pytest tests/ops/test_remote.py
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.conftest import TIMEOUT
from tests.ops.conftest import chat, homeai_serve

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    with homeai_serve(tmp_path_factory.mktemp("big")) as served:
        yield served


@pytest.fixture(scope="module")
def home(tmp_path_factory, big):
    remote = {"url": big.url + "/v1", "concurrency": 2, "timeout_s": 60.0}
    with homeai_serve(tmp_path_factory.mktemp("home"),
                      remote={"summaries": remote, "embeddings": {**remote, "fallback_local": True}}) as served:
        yield served


@pytest.fixture(scope="module")
def http(home):
    with httpx.Client(base_url=home.url, timeout=TIMEOUT) as client:
        yield client


def finished(url: str, lane: str) -> int:
    """Requests a homeai finished on `lane` (its Prometheus counter, all outcomes)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith("homeai_requests_total{") and f'lane="{lane}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_non_streaming_summaries_are_answered_by_the_remote(http, home, big):
    before = finished(big.url, "summaries")
    r = http.post("/v1/chat/completions", json=chat("Summarise: the cat sat on the mat.", lane="summaries",
                                                    max_tokens=8))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"]
    assert answer["usage"]["completion_tokens"] >= 1
    assert finished(big.url, "summaries") == before + 1  # big filed it in its own summaries lane
    assert finished(home.url, "summaries") == 0  # home's model never saw it
    assert finished(home.url, "chat") == 0


def test_streaming_passes_through_with_an_openai_client(home, big):
    before = finished(big.url, "summaries")
    client = openai.OpenAI(base_url=home.url + "/v1", api_key="anything", timeout=TIMEOUT, max_retries=0)
    chunks = list(client.chat.completions.create(
        model="homeai", messages=[{"role": "user", "content": "Summarise: rain tomorrow."}], max_tokens=8,
        stream=True, stream_options={"include_usage": True}, extra_body={"lane": "summaries"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage.completion_tokens >= 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert finished(big.url, "summaries") == before + 1
    remote = httpx.get(home.url + "/api/lanes", timeout=TIMEOUT).json()["lanes"]["summaries"]["remote"]
    assert remote["url"] == big.url + "/v1" and remote["running"] == 0 and remote["failures"] == 0


def test_a_stopped_remote_gives_clear_errors_and_the_fallback_lane_answers_locally(http, home, big):
    assert http.post("/v1/embeddings", json={"input": "hello"}).status_code == 200  # remote, while it runs
    assert finished(home.url, "embeddings") == 0
    assert big.terminate() == 0

    r = http.post("/v1/chat/completions", json=chat("Summarise: x.", lane="summaries", max_tokens=4))
    assert r.status_code == 502
    error = r.json()["error"]
    assert error["code"] == "remote_unavailable" and error["type"] == "server_error"
    assert f"the summaries lane's remote ({big.url}/v1) could not be reached" in error["message"]
    with http.stream("POST", "/v1/chat/completions",
                     json=chat("Summarise: x.", lane="summaries", max_tokens=4, stream=True)) as r:
        assert r.status_code == 502  # a proper status, not a broken stream
        r.read()
        assert r.json()["error"]["code"] == "remote_unavailable"

    r = http.post("/v1/embeddings", json={"input": ["hello", "world"]})
    assert r.status_code == 200 and len(r.json()["data"]) == 2  # home's own model, by fallback
    assert finished(home.url, "embeddings") == 2
    lanes = http.get("/api/lanes").json()["lanes"]
    assert lanes["embeddings"]["remote"]["fallbacks"] == 1 and lanes["summaries"]["remote"]["failures"] == 2
    r = http.post("/v1/chat/completions", json=chat("Say hi.", max_tokens=4))  # the chat lane stays local
    assert r.status_code == 200
