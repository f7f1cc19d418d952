"""Gemma 3 270M behind the real server (issue 50): the second family answers over Ollama's and
OpenAI's routes in its own turns, and calls a tool in the generic form held to its schema by a
grammar (its template knows no tools). One quick request each: the session's `gemma_runner`.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.api.conftest import add_token, api_config, serve
from tests.conftest import gemma_gguf

pytestmark = pytest.mark.model

MARKUP = ("<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>")
LIGHT = {"type": "object", "properties": {"name": {"type": "string"}, "area": {"enum": ["kitchen", "hall"]}},
         "required": ["name", "area"]}
TOOLS = [{"type": "function", "function": {"name": "intent__HassTurnOn", "description": "Turn a device on",
                                           "parameters": LIGHT}}]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, model={"path": gemma_gguf()})


@pytest.fixture(scope="module")
def server(cfg, gemma_runner):
    with serve(cfg, gemma_runner) as running:
        yield running


@pytest.fixture(scope="module")
def headers(cfg, server):
    return {"Authorization": f"Bearer {add_token(cfg, 'alice')}"}


def test_ollama_chat_answers_in_gemmas_turns(http, headers):
    body = {"model": "homeai", "stream": False, "options": {"temperature": 0, "num_predict": 8},
            "messages": [{"role": "system", "content": "You are the house."},
                         {"role": "user", "content": "Name three fruits."}]}
    reply = http.post("/api/chat", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    message = reply.json()["message"]
    assert message["role"] == "assistant" and message["content"]
    assert not any(mark in message["content"] for mark in MARKUP)


def test_a_required_tool_call_comes_in_the_generic_form_within_its_schema(http, headers):
    body = {"model": "homeai", "temperature": 0, "max_tokens": 48, "tools": TOOLS, "tool_choice": "required",
            "messages": [{"role": "user", "content": "Turn on the kitchen light."}]}
    reply = http.post("/v1/chat/completions", json=body, headers=headers)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and call["function"]["name"] == "intent__HassTurnOn"
    jsonschema.validate(json.loads(call["function"]["arguments"]), LIGHT)
