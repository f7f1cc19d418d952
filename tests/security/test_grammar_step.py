"""A grammar past the step budget, as a client sees it (issue 55, point 1): alice's answer ends with
an error in OpenAI's shape naming `step_budget_ms` (a 500 `generation_failed`, or the stream's error
event before `[DONE]`), and bob's chat, sharing the steps, is answered as ever. The budget is made
tiny here so that an ordinary grammar exceeds it whenever the model's pick is refused."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.security.conftest import TIMEOUT, add_token, post_json

pytestmark = pytest.mark.model

SCHEMA = {"type": "json_schema", "json_schema": {"name": "code", "schema": {
    "type": "object", "properties": {"zqxj": {"type": "integer"}}, "required": ["zqxj"]}}}


def ask(**extra) -> dict:
    return {"model": "homeai", "max_tokens": 4, "messages": [{"role": "user", "content": "Tell me about the sea."}],
            **extra}


@pytest.fixture
def tiny_budget(runner, monkeypatch):
    monkeypatch.setattr(runner.sampler, "grammar_budget_s", 0.00005)


@pytest.fixture(scope="module")
def clients(server, cfg):
    made = {name: httpx.Client(base_url=server.url, timeout=TIMEOUT,
                               headers={"Authorization": f"Bearer {add_token(cfg, name)}"})
            for name in ("alice-s", "bob-s")}
    yield made
    for client in made.values():
        client.close()


def test_alices_answer_ends_with_an_error_naming_the_budget(clients, tiny_budget):
    response = post_json(clients["alice-s"], "/v1/chat/completions", ask(response_format=SCHEMA))
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "generation_failed" and "step_budget_ms" in error["message"], error
    bob = post_json(clients["bob-s"], "/v1/chat/completions", ask())
    assert bob.status_code == 200 and bob.json()["choices"][0]["message"]["content"], bob.text


def test_a_stream_ends_with_the_error_event(clients, tiny_budget):
    body = ask(response_format=SCHEMA, stream=True)
    with clients["alice-s"].stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "generation_failed" and "step_budget_ms" in error["message"], error
