"""Thinking end to end, through the real `ollama` and `openai` clients and the household API, on
SmolLM2 served with a template whose generation prompt opens `<think>` (the R1 distills' form:
tests/fixtures/templates/chatml-think.jinja, SmolLM2's own ChatML turns). Two worked examples in the
history have the small model think, close `</think>` and answer, as a thinking model does.

Run: .venv/bin/python -m pytest -q tests/api/test_thinking.py
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from homeai.engine import template
from tests.api.conftest import TIMEOUT, add_token, api_config

pytestmark = pytest.mark.model

TEMPLATE = Path(__file__).parents[1] / "fixtures" / "templates" / "chatml-think.jinja"
SHOTS = [
    {"role": "user", "content": "What is 2 plus 2?"},
    {"role": "assistant", "content": "<think>\nTwo plus two is four.\n</think>\n\n4"},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "<think>\nThe sky is blue.\n</think>\n\nBlue"},
    {"role": "user", "content": "What is 3 plus 3?"},
]
GREEDY = {"temperature": 0, "num_predict": 40}


@contextlib.contextmanager
def served_with(runner, path: Path = TEMPLATE):
    """The shared runner formatting chats with the template file at `path`, chosen as
    `model.chat_template = "<path>"` chooses it, until the block ends (one model per session: the
    template is swapped, not the model loaded again)."""
    before = runner.chat
    runner.chat = template.choose(None, bos_token=before.template.bos_token, eos_token=before.template.eos_token,
                                  configured=str(path))
    try:
        yield
    finally:
        runner.chat = before


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True})


@pytest.fixture
def thinks(runner, server):
    with served_with(runner):
        yield


@pytest.fixture(scope="module")
def token(cfg, server):
    return add_token(cfg, "alice")


@pytest.fixture(scope="module")
def client(server, token):
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def oai(server, token):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(server, token):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}) as c:
        yield c


def model_name(http) -> str:
    return http.get("/api/tags").json()["models"][0]["name"]


# ---- Ollama -------------------------------------------------------------------------------


def test_ollama_think_true_gives_the_thoughts_apart_from_the_answer(client, http, thinks):
    name = model_name(http)
    whole = client.chat(model=name, messages=SHOTS, think=True, options=GREEDY, stream=False)
    thought, content = whole.message.thinking, whole.message.content
    assert thought and content, whole
    assert thought not in content and "think>" not in thought + content

    lines = list(client.chat(model=name, messages=SHOTS, think=True, options=GREEDY, stream=True))
    thinking_lines = [line for line in lines if line.message.thinking]
    assert thinking_lines and all(line.message.content == "" for line in thinking_lines)  # lines of their own
    assert "".join(line.message.thinking or "" for line in lines) == thought
    assert "".join(line.message.content or "" for line in lines) == content


def test_ollama_think_false_closes_the_thought_the_prompt_opened(client, http, thinks):
    answer = client.chat(model=model_name(http), messages=SHOTS, think=False, options=GREEDY, stream=False)
    assert not answer.message.thinking and answer.message.content


def test_ollama_generate_streams_thinking(client, http, thinks):
    lines = list(client.generate(model=model_name(http), prompt="Why is the sea salty?", think=True,
                                 options={"temperature": 0, "num_predict": 12}, stream=True))
    assert "".join(line.thinking or "" for line in lines)
    assert lines[-1].done and lines[-1].eval_count == 12  # the thought's tokens are the answer's


def test_an_answer_held_to_a_format_does_not_think(client, http, thinks):
    """The grammar holds the reply from its first token: the prompt's thought is closed, so the
    JSON is the answer, not taken for a thought."""
    answer = client.chat(model=model_name(http), messages=SHOTS[4:], think=True, format="json", stream=False,
                         options={"temperature": 0, "num_predict": 24})
    assert not answer.message.thinking and answer.message.content.lstrip().startswith("{")


def test_earlier_thoughts_are_not_sent_to_a_template_that_does_not_read_them(http, thinks):
    def prompt_tokens(thinking: str | None) -> int:
        said = {"role": "assistant", "content": "4", **({"thinking": thinking} if thinking else {})}
        body = {"model": model_name(http), "stream": False, "think": False, "options": {"num_predict": 1},
                "messages": [SHOTS[0], said, SHOTS[4]]}
        r = http.post("/api/chat", json=body)
        assert r.status_code == 200, r.text
        return r.json()["prompt_eval_count"]

    assert prompt_tokens("A long line of earlier reasoning that the model would read. " * 5) == prompt_tokens(None)


@pytest.mark.parametrize("value", [5, {"level": "high"}, "extreme", [True]])
def test_a_think_value_of_the_wrong_type_is_a_400(http, value):
    r = http.post("/api/chat", json={"model": model_name(http), "messages": SHOTS[:1], "think": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("invalid think value:")


def test_a_model_that_cannot_think_refuses_think_as_ollama_does(http):
    name = model_name(http)
    for think in (True, "high"):
        r = http.post("/api/chat", json={"model": name, "messages": SHOTS[:1], "think": think, "stream": False})
        assert r.status_code == 400 and r.json() == {"error": f'"{name}" does not support thinking'}, r.text
    r = http.post("/api/chat", json={"model": name, "messages": SHOTS[:1], "think": False, "stream": False,
                                     "options": {"num_predict": 2}})
    assert r.status_code == 200 and "thinking" not in r.json()["message"], r.text
    assert "thinking" not in http.post("/api/show", json={"model": name}).json()["capabilities"]


def test_show_says_the_model_thinks_and_which_template(http, thinks):
    shown = http.post("/api/show", json={"model": model_name(http)}).json()
    assert "thinking" in shown["capabilities"] and "completion" in shown["capabilities"]
    assert shown["template"] == TEMPLATE.read_text()
    assert shown["chat_template"]["name"] == "file" and TEMPLATE.name in shown["chat_template"]["description"]
    assert "opens <think>" in shown["chat_template"]["thinking"]


# ---- OpenAI -------------------------------------------------------------------------------


def test_openai_streams_reasoning_content_and_counts_thought_tokens(oai, server, runner, thinks):
    """A reply all thought (this one never closes `</think>`): every token is counted in `usage` and
    charged to the member's fair share, though none is content."""
    fair = server.program.engine.scheduler.fair
    before = fair.counter(("chat", "alice"))
    stream = oai.chat.completions.create(model="homeai", messages=SHOTS[4:], max_tokens=16, temperature=0,
                                         reasoning_effort="high", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert reasoning and not "".join(d.content or "" for d in deltas)
    num_tokens = chunks[-1].usage.completion_tokens
    assert num_tokens >= len(reasoning.split())  # a word of thought is a token or more
    charged = fair.counter(("chat", "alice")) - before
    assert charged >= fair.cost(weight=server.program.engine.policies["chat"].weight, num_out=num_tokens)


def test_openai_message_has_reasoning_content(oai, thinks):
    answer = oai.chat.completions.create(model="homeai", messages=SHOTS, max_tokens=40, temperature=0,
                                         reasoning_effort="medium")
    message = answer.choices[0].message
    assert message.reasoning_content and message.content
    assert message.reasoning_content not in message.content


@pytest.mark.parametrize("extra", [{"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}}])
def test_openai_no_thinking(oai, thinks, extra):
    answer = oai.chat.completions.create(model="homeai", messages=SHOTS, max_tokens=20, temperature=0,
                                         extra_body=extra)
    message = answer.choices[0].message
    assert message.content and getattr(message, "reasoning_content", None) is None


@pytest.mark.parametrize("kwargs, says", [
    ({"messages": []}, "own input"), ({"add_generation_prompt": False}, "own input"),
    ({"not-a-name": 1}, "not a template variable name"), ({f"v{i}": i for i in range(40)}, "at most 32"),
    ({"v": "x" * 20_000}, "over 16384 characters"), ("enable_thinking", None)])
def test_bad_chat_template_kwargs_are_a_400(http, kwargs, says):
    r = http.post("/v1/chat/completions", json={"messages": SHOTS[:1], "chat_template_kwargs": kwargs})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "chat_template_kwargs" or "chat_template_kwargs" in error["message"]
    assert says is None or says in error["message"]


def test_a_bad_reasoning_effort_is_a_400(http):
    r = http.post("/v1/chat/completions", json={"messages": SHOTS[:1], "reasoning_effort": "extreme"})
    assert r.status_code == 400 and "reasoning_effort" in r.text


# ---- the household API --------------------------------------------------------------------


def test_the_household_gets_thoughts_apart_and_stores_only_the_answer(http, thinks):
    conversation = http.post("/api/conversations", json={"title": "thinking"}).json()["id"]
    body = {"content": "What is 3 plus 3?", "max_tokens": 12, "temperature": 0, "think": True}
    with http.stream("POST", f"/api/conversations/{conversation}/messages", json=body) as r:
        assert r.status_code == 200
        events = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line]
    thought = "".join(e["text"] for e in events if e["type"] == "response.thinking")
    said = "".join(e["text"] for e in events if e["type"] == "response.delta")
    done = events[-1]
    assert thought and done["type"] == "response.done" and done["thinking"] == thought
    assert done["usage"]["completion_tokens"] >= len(thought.split())  # the thought's tokens are the answer's
    stored = http.get(f"/api/conversations/{conversation}").json()["messages"]
    answers = [m["content"] for m in stored if m["role"] == "assistant"]
    assert answers == ([said] if said else [])
    assert all(thought not in a for a in answers)
