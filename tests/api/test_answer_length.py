"""How long an answer runs (issue 54): a household's lane cap ends it with "length" between words,
streamed or not, on both protocols; a length the request names cuts where it asked. (With no cap
anywhere, it runs to its end of turn or its cache's room: tests/service/test_words.py.)

Run: .venv/bin/python -m pytest -q tests/api/test_answer_length.py
"""

from __future__ import annotations

import json

import httpx
import pytest

from homeai.service.words import is_break
from tests.api.conftest import TIMEOUT, api_config, serve

pytestmark = pytest.mark.model

CAP = 24
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


@pytest.fixture(scope="module")
def server(module_tmp, runner):
    with serve(api_config(module_tmp, lanes={"chat": {"max_tokens": CAP}}), runner) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        yield client


def ends_between_words(text: str) -> bool:
    return text == "" or is_break(text[-1])


def test_the_lanes_cap_ends_a_streamed_answer_between_words(http):
    body = {"model": "homeai", "messages": STORY, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert finish == ["length"]
    assert next(c["usage"] for c in chunks if c.get("usage"))["completion_tokens"] == CAP
    assert text.strip() and ends_between_words(text), text


def test_the_lanes_cap_ends_an_ollama_answer_between_words(http):
    r = http.post("/api/chat", json={"model": "homeai", "messages": STORY, "stream": False,
                                     "options": {"temperature": 0}})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["done_reason"] == "length" and answer["eval_count"] == CAP
    assert answer["message"]["content"].strip() and ends_between_words(answer["message"]["content"])


def test_a_length_the_request_names_is_cut_where_it_asked(http):
    r = http.post("/v1/chat/completions", json={"model": "homeai", "messages": STORY, "temperature": 0,
                                                "max_tokens": CAP + 3})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == CAP + 3
