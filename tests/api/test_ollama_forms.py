"""Ollama's names and older forms as real clients send them (issue 27), on a real server.

* `/v1` takes the names `/api/tags` lists (`<id>:latest`), as Open WebUI's `/ollama/v1/...`
  passthrough sends them: chat, completions and embeddings, through the `openai` client.
* `/api/embeddings` (`prompt` -> `embedding`), through the `ollama` client, on the embeddings lane.
* `keep_alive: 0` with nothing to answer is Ollama's unload call: `done_reason` "unload", and the
  model stays loaded for the household; with a prompt it is answered as ever.
* Open WebUI's background tasks (title, tags, follow-ups: recognised by their templates) land on
  `[clients] background_task_lane`, not on the chat lane; the recorded bodies are posted as they are.
  Its answer from retrieved documents (its retrieval template also opens "### Task:") stays on
  chat (the rules alone: tests/service/test_clients.py).

Run: .venv/bin/python -m pytest tests/api/test_ollama_forms.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import ollama
import openai
import pytest

from tests.api.conftest import TIMEOUT, api_config, lanes

pytestmark = pytest.mark.model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
SHORT = {"num_predict": 4, "temperature": 0}


@pytest.fixture(scope="module")
def cfg(module_tmp):
    """The summaries lane's answers capped (as a household may): Open WebUI's recorded tag and follow-up
    bodies ask no length, and a sampled tag list ran from 1 s to 26 s by its length alone. The title
    bodies ask 1,000 tokens (`num_predict`, `max_tokens`), which a request may (`task_body`)."""
    return api_config(module_tmp, lanes={"summaries": {"max_tokens": 32}})


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def tagged(client) -> str:
    """The served model as `/api/tags` lists it."""
    name = client.list().models[0].model
    assert name.endswith(":latest")
    return name


def finished(http, lane: str) -> int:
    return lanes(http)[lane]["finished"]


# ---- /v1 takes Ollama's names -------------------------------------------------------------------


def test_openai_chat_completions_and_embeddings_take_the_tagged_name(oai, tagged):
    chat = oai.chat.completions.create(model=tagged, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.choices[0].message.content is not None
    assert chat.model == tagged.removesuffix(":latest")
    completion = oai.completions.create(model=tagged, prompt="Once upon a time", max_tokens=4)
    assert completion.choices[0].text
    vectors = oai.embeddings.create(model=tagged, input="the kitchen light")
    assert len(vectors.data[0].embedding) > 0


def test_openai_streams_under_the_tagged_name(oai, tagged):
    stream = oai.chat.completions.create(model=tagged, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                         stream=True)
    assert [chunk.choices[0].finish_reason for chunk in stream if chunk.choices][-1] in ("stop", "length")


def test_an_unknown_tag_is_still_404(oai, tagged):
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(model=tagged.replace(":latest", ":7b"), messages=[{"role": "user", "content": "Hi"}])


# ---- /api/embeddings ----------------------------------------------------------------------------


def test_older_embeddings_give_the_prompts_vector_on_the_embeddings_lane(client, tagged, server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        before = finished(http, "embeddings")
        old = client.embeddings(model=tagged, prompt="Turn on the porch light")
        assert finished(http, "embeddings") == before + 1
    new = client.embed(model=tagged, input="Turn on the porch light").embeddings[0]
    vector = np.asarray(old.embedding)
    assert vector.shape == (len(new),)
    # /api/embed normalises, /api/embeddings gives the vector as it is (as Ollama's do)
    assert np.allclose(vector / np.linalg.norm(vector), new, atol=1e-5)


def test_older_embeddings_empty_prompt_loads_and_unknown_model_is_404(client, tagged):
    assert client.embeddings(model=tagged, prompt="").embedding == []
    with pytest.raises(ollama.ResponseError) as e:
        client.embeddings(model="no-such-model", prompt="hi")
    assert e.value.status_code == 404


# ---- keep_alive: 0 ------------------------------------------------------------------------------


@pytest.mark.parametrize("keep_alive", [0, "0", "0s", 0.0])
def test_keep_alive_zero_with_nothing_to_answer_unloads_as_ollama_says(client, tagged, keep_alive):
    generated = client.generate(model=tagged, prompt="", keep_alive=keep_alive)
    assert (generated.done, generated.done_reason, generated.response) == (True, "unload", "")
    assert generated.model == tagged and generated.created_at
    chatted = client.chat(model=tagged, messages=[], keep_alive=keep_alive)
    assert (chatted.done, chatted.done_reason, chatted.message.content) == (True, "unload", "")
    # a household model: it stays loaded for the others
    assert [m.model for m in client.ps().models] == [tagged]


def test_an_empty_call_without_keep_alive_zero_still_loads(client, tagged):
    assert client.generate(model=tagged, prompt="", keep_alive="5m").done_reason == "load"
    assert client.chat(model=tagged, messages=[], keep_alive=-1).done_reason == "load"


def test_keep_alive_zero_with_a_prompt_is_answered(client, tagged):
    generated = client.generate(model=tagged, prompt="Say hi", keep_alive=0, options=SHORT)
    assert generated.done_reason in ("stop", "length") and generated.eval_count > 0
    chatted = client.chat(model=tagged, messages=[{"role": "user", "content": "Say hi"}], keep_alive="0s",
                          options=SHORT)
    assert chatted.done_reason in ("stop", "length") and chatted.eval_count > 0


# ---- Open WebUI's background tasks --------------------------------------------------------------

TASKS = ("title", "tags", "follow_ups")


@pytest.fixture(scope="module")
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Content-Type": "application/json"}) as c:
        yield c


def task_body(name: str) -> bytes:
    """A recorded task body as it was sent, but for a length it asks, cut to the lane's cap: the title's
    1,000 tokens took 30-40 s of this box's CPU a body, and the lane a body lands on does not hang on it."""
    body = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    if "max_tokens" in body:
        body["max_tokens"] = 32
    if "num_predict" in body.get("options", {}):
        body["options"]["num_predict"] = 32
    return json.dumps(body).encode()


@pytest.mark.parametrize("path, name", [("/api/chat", f"ollama_{t}.json") for t in TASKS]
                         + [("/v1/chat/completions", f"openai_{t}.json") for t in TASKS])
def test_open_webuis_recorded_tasks_land_on_the_background_task_lane(http, path, name):
    before = lanes(http)
    r = http.post(path, content=task_body(name))
    assert r.status_code == 200, r.text
    after = lanes(http)
    assert after["summaries"]["finished"] == before["summaries"]["finished"] + 1
    assert after["chat"]["finished"] == before["chat"]["finished"]


@pytest.mark.parametrize("path, name", [("/api/chat", "ollama_rag.json"), ("/v1/chat/completions", "openai_rag.json")])
def test_open_webuis_answer_from_documents_stays_on_the_chat_lane(http, path, name):
    body = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    del body["tools"]  # its 36 tools are 6,600 tokens: more than this server's small cache holds
    body.update({"options": SHORT} if path == "/api/chat" else {"max_tokens": 4})  # streamed, as it is sent
    before = lanes(http)
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    after = lanes(http)
    assert after["chat"]["finished"] == before["chat"]["finished"] + 1
    assert after["summaries"]["finished"] == before["summaries"]["finished"]


def test_peoples_chats_stay_on_the_chat_lane(http, tagged):
    before = lanes(http)["chat"]["finished"]
    r = http.post("/api/chat", json={"model": tagged, "stream": False, "options": SHORT,
                                     "messages": [{"role": "user", "content": "What is a ### Task: heading?"}]})
    assert r.status_code == 200, r.text
    assert lanes(http)["chat"]["finished"] == before + 1
