"""The OpenAI-compatible endpoints through the `openai` client and raw HTTP, on a real server.

Run: .venv/bin/python -m pytest tests/api/test_openai.py
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import api_config, lanes

pytestmark = pytest.mark.model

HI = [{"role": "user", "content": "Say hello to the family."}]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    # Without the prompt cache a repeated request is read the same way each time, so greedy runs
    # compared here (whole and streamed, with and without a stop) take the same numeric path: a
    # prompt read after a cached prefix differs in the last bits of its logits.
    return api_config(module_tmp, scheduler={"prompt_cache": False})


def sse_lines(http, path: str, body: dict) -> list[dict | str]:
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in raw), raw
    payloads = [line.removeprefix("data: ") for line in raw]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def test_healthz_names_the_model(http):
    body = http.get("/healthz").json()
    assert body["status"] == "ok" and body["model"].startswith("SmolLM2")


def test_models_lists_the_loaded_model(client, http):
    models = client.models.list().data
    served = http.get("/healthz").json()["model"]
    # then its lane names, for the household's lanes but embeddings (issue 27: tests/api/test_lane_names.py)
    assert [m.id for m in models] == [served] + [f"{served}:{lane}" for lane in ("voice", "chat", "summaries", "indexing")]
    assert models[0].object == "model" and models[0].owned_by == "homeai"


def test_chat_completion(client):
    reply = client.chat.completions.create(model="homeai", messages=HI, max_tokens=8, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_streaming_matches_the_whole_answer(client):
    whole = client.chat.completions.create(model="homeai", messages=HI, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="homeai", messages=HI, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_sse_wire_format(http):
    events = sse_lines(http, "/v1/chat/completions",
                       {"messages": HI, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1


def test_stop_string_ends_the_answer(client):
    free = client.chat.completions.create(model="homeai", messages=HI, max_tokens=24, temperature=0)
    text = free.choices[0].message.content
    words = text.split()
    assert len(words) >= 3, text
    stop = " " + words[2]  # the third word, as it first appears
    cut = text[: text.index(stop)]
    stopped = client.chat.completions.create(model="homeai", messages=HI, max_tokens=24, temperature=0, stop=[stop])
    assert stopped.choices[0].message.content == cut
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="homeai", messages=HI, max_tokens=24, temperature=0,
                                              stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == cut


def test_chat_logprobs_shape(client):
    reply = client.chat.completions.create(model="homeai", messages=HI, max_tokens=5, temperature=0,
                                           logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert "".join(e.token for e in entries).startswith(reply.choices[0].message.content)
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0 and bytes(e.bytes).decode() == e.token
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        # greedy: the chosen token is the most likely one
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob)


def test_completions_with_legacy_logprobs(client):
    reply = client.completions.create(model="homeai", prompt="1, 2, 3, 4,", max_tokens=6, temperature=0,
                                      logprobs=2)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and choice.text
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    assert all(len(top) <= 2 for top in lp.top_logprobs)


def test_completions_streaming(client):
    whole = client.completions.create(model="homeai", prompt="Once upon a time", max_tokens=8, temperature=0)
    chunks = list(client.completions.create(model="homeai", prompt="Once upon a time", max_tokens=8,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_embeddings_for_a_list(client):
    texts = ["The kitchen light is on.", "The kitchen lamp is lit.", "Quarterly tax filing deadline."]
    result = client.embeddings.create(model="homeai", input=texts)  # the client asks for base64
    vectors = np.array([d.embedding for d in result.data])
    assert [d.index for d in result.data] == [0, 1, 2] and vectors.shape[1] > 100
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2]
    assert result.usage.prompt_tokens > 0
    floats = client.embeddings.create(model="homeai", input=texts[0], encoding_format="float")
    assert np.allclose(floats.data[0].embedding, vectors[0], atol=1e-6)


def test_lane_from_extra_body_and_header(client, http):
    before = lanes(http)
    client.chat.completions.create(model="homeai", messages=HI, max_tokens=2, extra_body={"lane": "voice"})
    client.chat.completions.create(model="homeai", messages=HI, max_tokens=2,
                                   extra_headers={"X-HomeAI-Lane": "summaries"})
    after = lanes(http)
    assert after["voice"]["finished"] == before["voice"]["finished"] + 1
    assert after["summaries"]["finished"] == before["summaries"]["finished"] + 1


def test_lanes_view(http):
    body = http.get("/api/lanes").json()
    assert set(body["lanes"]) == {"voice", "chat", "summaries", "indexing", "embeddings"}
    chat = body["lanes"]["chat"]
    assert chat["policy"]["lane_class"] == "interactive" and chat["finished"] >= 1
    assert chat["ttft_ms"]["p50"] is not None and set(chat["itl_ms"]) == {"p50", "p95"}
    assert body["kv"]["cells_used"] == 0 and body["kv"]["cells_total"] > 0


def test_metrics_parse_and_show_the_lanes_used(client, http):
    client.embeddings.create(model="homeai", input=["one more"])
    text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("homeai_queue_seconds", "homeai_ttft_seconds", "homeai_itl_seconds", "homeai_e2e_seconds",
                 "homeai_requests", "homeai_prompt_tokens", "homeai_output_tokens", "homeai_preemptions",
                 "homeai_rejections", "homeai_queue_depth", "homeai_running_sequences",
                 "homeai_kv_cells_used", "homeai_kv_cells_free"):
        assert name in families, name
    requests = {(s.labels["lane"], s.labels["outcome"]): s.value for s in families["homeai_requests"].samples
                if s.name == "homeai_requests_total"}
    for lane in ("chat", "voice", "summaries", "embeddings"):
        assert sum(v for (lane_, _), v in requests.items() if lane_ == lane) >= 1, lane
    ttft_count = {s.labels["lane"]: s.value for s in families["homeai_ttft_seconds"].samples
                  if s.name == "homeai_ttft_seconds_count"}
    assert ttft_count["chat"] >= 1 and ttft_count["indexing"] == 0
    output = {s.labels["lane"]: s.value for s in families["homeai_output_tokens"].samples
              if s.name == "homeai_output_tokens_total"}
    assert output["chat"] > 0 and output["embeddings"] == 0
    assert {s.labels["lane"] for s in families["homeai_queue_depth"].samples} >= {"chat", "embeddings"}
    loaded = [s.value for s in families["homeai_model_loaded"].samples]
    assert loaded == [1.0]
