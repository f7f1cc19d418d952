"""The Ollama-compatible API through the real `ollama` client (Home Assistant's) and raw HTTP, on a real server.

Auth is on: the client sends a member's token as Home Assistant's can (`OLLAMA_API_KEY` or headers).

Run: .venv/bin/python -m pytest tests/api/test_ollama.py
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import ollama
import pytest

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.api.conftest import TIMEOUT, add_token, api_config, lanes, wait_for

pytestmark = pytest.mark.model

HI = [{"role": "user", "content": "Say hello to the family."}]
SHORT = {"num_predict": 6, "temperature": 0, "seed": 7}
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, lanes={"summaries": {"max_queue": 1}})


@pytest.fixture(scope="module")
def token(cfg, server):
    return add_token(cfg, "alice")


def client_for(server, token: str | None, **headers) -> ollama.Client:
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return ollama.Client(host=server.url, headers=headers, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def client(server, token):
    return client_for(server, token)


@pytest.fixture(scope="module")
def authed(server, token):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}) as c:
        yield c


@pytest.fixture(scope="module")
def served(client) -> str:
    return client.list().models[0].model


# ---- the served model -------------------------------------------------------------------------


def test_version(authed):
    body = authed.get("/api/version").json()
    assert re.fullmatch(r"\d+\.\d+\.\d+", body["version"])


def test_list_names_the_served_model_with_its_facts(client, server):
    models = client.list().models
    card = server.program.models["generate"]
    # then its lane names, for the household's lanes but embeddings (issue 27: tests/api/test_lane_names.py)
    assert [m.model for m in models] == [f"{card.id}:latest"] + [f"{card.id}:{lane}" for lane in ("voice", "chat", "summaries", "indexing")]
    model = models[0]
    assert model.size == Path(card.path).stat().st_size and re.fullmatch(r"[0-9a-f]{64}", model.digest)
    assert model.details.format == "gguf" and model.details.family == "llama"
    assert model.details.parameter_size == "135M" and model.details.quantization_level == "Q4_1"
    assert model.modified_at is not None


def test_show_gives_details_context_length_and_capabilities(client, served, server):
    shown = client.show(served)
    assert shown.details.family == "llama"
    assert shown.modelinfo["llama.context_length"] == server.program.runner.info.n_ctx_train
    assert shown.modelinfo["general.architecture"] == "llama"
    assert "completion" in shown.capabilities and "embedding" in shown.capabilities  # one file does both
    assert "{%" in shown.template  # the GGUF's chat template
    with pytest.raises(ollama.ResponseError) as refused:
        client.show("llama3.2:latest")
    assert refused.value.status_code == 404


def test_ps_lists_the_loaded_model(client, served):
    running = client.ps().models
    assert [m.model for m in running] == [served] and running[0].context_length > 0


def test_pull_of_the_served_model_succeeds_without_downloading(client, served):
    assert client.pull(served).status == "success"
    assert [p.status for p in client.pull(served, stream=True)][-1] == "success"
    with pytest.raises(ollama.ResponseError) as refused:
        client.pull("llama3.2")
    assert refused.value.status_code == 404 and "llama3.2" in refused.value.error


# ---- chat and generate --------------------------------------------------------------------------


def test_chat_whole(client, served):
    reply = client.chat(model=served, messages=HI, stream=False, options=SHORT)
    assert reply.message.role == "assistant" and reply.message.content
    assert reply.done and reply.done_reason in ("stop", "length")
    assert 0 < reply.eval_count <= 6 and reply.prompt_eval_count > 0
    assert all(isinstance(reply[d], int) and reply[d] >= 0 for d in DURATIONS) and reply.total_duration > 0


def test_chat_streamed_matches_the_whole_answer(client, served):
    whole = client.chat(model=served, messages=HI, stream=False, options=SHORT)
    parts = list(client.chat(model=served, messages=HI, stream=True, options=SHORT))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count and parts[-1].done_reason == whole.done_reason


def test_chat_streams_ndjson_by_default(authed, served):
    with authed.stream("POST", "/api/chat", json={"model": served, "messages": HI, "options": SHORT}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        raw = r.read().decode()
    lines = raw.split("\n")
    assert lines[-1] == "" and all(lines[:-1])  # one object a line, no blank lines
    objects = [json.loads(line) for line in lines[:-1]]
    assert [o["done"] for o in objects] == [False] * (len(objects) - 1) + [True]
    assert all(isinstance(objects[-1][d], int) for d in (*DURATIONS, "eval_count", "prompt_eval_count"))


def test_num_predict_limits_the_answer(client, served):
    reply = client.chat(model=served, messages=HI, stream=False, options={"num_predict": 2, "temperature": 0})
    assert reply.eval_count <= 2
    long = client.generate(model=served, prompt="Count from one to fifty in words.", stream=False,
                           options={"num_predict": 3, "temperature": 0})
    assert long.eval_count == 3 and long.done_reason == "length"


def test_seed_and_temperature_zero_are_deterministic(client, served):
    # The same prompt read the same way gives the same answer, greedy or sampled with a seed. The
    # first read is left out: a prompt read whole (or after a shorter cached prefix, an earlier
    # test's) and one read after its own cached prefix differ in the last bits of their logits,
    # which can turn a near-tie, greedy too, or a sampler at 0.9 into another token.
    options = {"num_predict": 12, "temperature": 0, "seed": 3}
    client.chat(model=served, messages=HI, stream=False, options=options)
    first = client.chat(model=served, messages=HI, stream=False, options=options).message.content
    assert client.chat(model=served, messages=HI, stream=False, options=options).message.content == first
    sampled = {"num_predict": 12, "temperature": 0.9, "seed": 11}
    client.generate(model=served, prompt="Name a colour.", options=sampled)
    once = client.generate(model=served, prompt="Name a colour.", options=sampled).response
    assert client.generate(model=served, prompt="Name a colour.", options=sampled).response == once


def test_generate_whole_streamed_and_raw(client, served):
    whole = client.generate(model=served, prompt="Name a fruit.", system="Answer in one word.", options=SHORT)
    assert whole.response and whole.done and whole.eval_count <= 6
    parts = list(client.generate(model=served, prompt="Name a fruit.", system="Answer in one word.",
                                 options=SHORT, stream=True))
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    raw = client.generate(model=served, prompt="The capital of France is", raw=True, options=SHORT)
    assert raw.response and raw.prompt_eval_count < whole.prompt_eval_count  # no template around it


def test_history_with_tool_calls_and_tools_is_answered(client, served):
    tools = [{"type": "function", "function": {"name": "GetLiveContext", "description": "The home's state",
                                                "parameters": {"type": "object", "properties": {}}}}]
    messages = [*HI, {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "GetLiveContext", "arguments": {}}}]},
                {"role": "tool", "tool_name": "GetLiveContext", "content": "The kitchen light is on."}]
    reply = client.chat(model=served, messages=messages, tools=tools, stream=False, options=SHORT)
    assert reply.done and reply.eval_count > 0


def test_empty_chat_and_generate_load_the_model(client, served):
    assert client.chat(model=served, messages=[]).done_reason == "load"
    assert client.generate(model=served, prompt="").done_reason == "load"


def test_embed(client, served, server):
    one = client.embed(model=served, input="the kitchen light")
    assert len(one.embeddings) == 1 and len(one.embeddings[0]) == server.program.runner.info.embed_n_embd
    assert np.linalg.norm(one.embeddings[0]) == pytest.approx(1.0, abs=1e-4)  # Ollama's are unit vectors
    two = client.embed(model=served, input=["the kitchen light", "a recipe for bread"])
    assert len(two.embeddings) == 2 and two.prompt_eval_count > one.prompt_eval_count
    assert two.embeddings[0] == pytest.approx(one.embeddings[0], abs=1e-4)


# ---- refusals, as Ollama answers them -----------------------------------------------------------


def refused(call, *args, **kwargs) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as caught:
        result = call(*args, **kwargs)
        if not isinstance(result, ollama.ChatResponse | ollama.GenerateResponse | ollama.EmbedResponse):
            list(result)
    assert isinstance(caught.value.error, str)
    return caught.value


def test_unknown_model_is_404_as_ollama_says(client):
    error = refused(client.chat, model="llama3.2", messages=HI)
    assert error.status_code == 404 and error.error == 'model "llama3.2" not found, try pulling it first'
    assert refused(client.generate, model="nope", prompt="hi").status_code == 404
    assert refused(client.embed, model="nope", input="hi").status_code == 404


def test_images_are_refused(client, served):
    pixel = b"\x89PNG\r\n\x1a\n"
    error = refused(client.chat, model=served, messages=[{"role": "user", "content": "What is this?",
                                                          "images": [pixel]}])
    assert error.status_code == 400 and "images" in error.error
    assert refused(client.generate, model=served, prompt="What is this?", images=[pixel]).status_code == 400


@pytest.mark.parametrize("options", [{"temperature": "hot"}, {"num_predict": 2.5}, {"stop": "\n"},
                                     {"top_p": 3}, {"seed": "7"}])
def test_malformed_options_are_400(client, served, options):
    error = refused(client.chat, model=served, messages=HI, options=options, stream=False)
    assert error.status_code == 400 and list(options)[0] in error.error


def test_unknown_options_are_ignored(client, served):
    reply = client.chat(model=served, messages=HI, stream=False, options={**SHORT, "mirostat": 2, "num_gpu": 99})
    assert reply.done


def test_format_is_validated(client, served):
    bad = refused(client.chat, model=served, messages=HI, format={"type": "thing"}, stream=False)
    assert bad.status_code == 400 and "type" in bad.error
    beyond = refused(client.chat, model=served, messages=HI, format={"not": {"type": "string"}}, stream=False)
    assert beyond.status_code == 400 and "format" in beyond.error


def test_format_json_and_a_schema_hold_the_answer(client, served):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                               "rooms": {"type": "integer"}}, "required": ["name", "rooms"]}
    reply = client.chat(model=served, messages=[{"role": "user", "content": "Describe our house as JSON."}],
                        format=schema, stream=False, options={"temperature": 0, "num_predict": 96})
    assert reply.done_reason == "stop", reply.message.content
    jsonschema.validate(json.loads(reply.message.content), schema)
    # "json" is any object: no bound, and this small model can repeat keys until the limit (whether
    # greedy text runs on depends on what it is batched with). Each reply is an object's opening;
    # of three asks, those that end are whole objects (in 17-77 tokens here; the third runs to any cut).
    ended = []
    for ask in ("Give the name and age of a person as JSON.", "A shopping list as JSON.", "Our pets as JSON."):
        as_json = client.chat(model=served, messages=[{"role": "user", "content": ask}], format="json",
                              stream=False, options={"temperature": 0, "num_predict": 128})
        assert as_json.message.content.lstrip().startswith("{"), as_json.message.content
        if as_json.done_reason == "stop":
            ended.append(json.loads(as_json.message.content))
    assert ended and all(isinstance(obj, dict) for obj in ended)


HA_TOOLS = [
    {"type": "function", "function": {"name": "HassTurnOn", "description": "Turns on/opens a device or entity",
                                      "parameters": {"type": "object", "properties": {
                                          "name": {"type": "string"}, "area": {"type": "string"},
                                          "domain": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "GetLiveContext", "description":
                                      "Provides real-time information about the CURRENT state of devices and areas",
                                      "parameters": {"type": "object", "properties": {}}}},
]
HA_SYSTEM = {"role": "system", "content": "You are a voice assistant for Home Assistant. Answer questions about "
                                          "the world truthfully. Static context: Kitchen Light (light) in Kitchen."}
LIGHT_ON = [HA_SYSTEM, {"role": "user", "content": "Turn on the kitchen light."}]
# The same tools with HassTurnOn's strings and domain list bounded, for a forced call that must close
# within its limit (the model could otherwise write `"light", "light", ...` until the cut).
BOUNDED_HA_TOOLS = [{"type": "function", "function": {**HA_TOOLS[0]["function"], "parameters": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                     "area": {"type": "string", "maxLength": 40},
                                     "domain": {"type": "array", "maxItems": 2,
                                                "items": {"type": "string", "maxLength": 16}}}}}},
                    HA_TOOLS[1]]
FORCED = {"tool_choice": "required"}  # homeai's own field: a 135M model does not reliably choose a tool itself


def chat_lines(authed, body: dict) -> list[dict]:
    with authed.stream("POST", "/api/chat", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r.iter_lines() if line]


def check_ha_calls(calls) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in HA_TOOLS}
    assert calls
    for call in calls:
        jsonschema.validate(dict(call["function"]["arguments"]), schemas[call["function"]["name"]])


def test_home_assistant_tools_call_then_a_result_without_an_id_then_an_answer(authed, served):
    lines = chat_lines(authed, {"model": served, "messages": LIGHT_ON, "tools": BOUNDED_HA_TOOLS, **FORCED,
                                "options": {"temperature": 0, "num_predict": 192}})
    with_calls = [line for line in lines if line.get("message", {}).get("tool_calls")]
    assert with_calls and all(len(line["message"]["tool_calls"]) == 1 for line in with_calls), lines  # a line each
    calls = [call for line in with_calls for call in line["message"]["tool_calls"]]
    check_ha_calls(calls)
    # A later call may run into the limit: the calls sent whole stay sent, the cut one is dropped.
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] in ("stop", "length")
    history = [*LIGHT_ON, {"role": "assistant", "content": "", "tool_calls": calls},
               {"role": "tool", "content": json.dumps({"success": True, "targets": ["Kitchen Light"]})}]
    answer = chat_lines(authed, {"model": served, "messages": history, "tools": HA_TOOLS, "tool_choice": "none",
                                 "options": {"temperature": 0, "num_predict": 32}})
    assert "".join(line["message"]["content"] for line in answer) and answer[-1]["done"] is True
    assert not any(line["message"].get("tool_calls") for line in answer)


def test_home_assistant_tools_through_the_ollama_client(client, served):
    reply = client.chat(model=served, messages=LIGHT_ON, tools=HA_TOOLS, stream=False,
                        options={"temperature": 0, "num_predict": 96}, **{})
    # Without a forced choice the small model may answer in words; either is a valid reply.
    if reply.message.tool_calls:
        check_ha_calls([{"function": {"name": c.function.name, "arguments": c.function.arguments}}
                        for c in reply.message.tool_calls])
    else:
        assert reply.message.content
    streamed = list(client.chat(model=served, messages=LIGHT_ON, tools=HA_TOOLS, stream=True,
                                options={"temperature": 0, "num_predict": 96}))
    calls = [c for part in streamed for c in part.message.tool_calls or ()]
    # Streamed, each call comes whole on a line of its own, or the answer is words (greedy text is
    # not batch-invariant, so this run need not choose as the one before did).
    if calls:
        check_ha_calls([{"function": {"name": c.function.name, "arguments": c.function.arguments}} for c in calls])
    assert all(len(part.message.tool_calls or ()) <= 1 for part in streamed)
    assert calls or "".join(part.message.content for part in streamed)


def test_show_says_the_model_takes_tools(client, served):
    assert "tools" in client.show(served).capabilities


def test_bad_tools_are_400(authed, served):
    body = {"model": served, "messages": HI, "stream": False,
            "tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": 7}}}]}
    r = authed.post("/api/chat", json=body)
    assert r.status_code == 400 and "tools.0.function.parameters" in r.json()["error"]


def test_a_prompt_over_the_context_is_a_clear_400(client, served, server):
    words = server.program.engine.max_seq_len_for("chat") + 50
    error = refused(client.generate, model=served, prompt="word " * words, raw=True, options={"num_ctx": 100000})
    assert error.status_code == 400 and "tokens" in error.error


def test_bad_json_and_wrong_types_are_400_in_ollama_shape(authed, served):
    r = authed.post("/api/chat", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = authed.post("/api/chat", json={"model": served, "messages": HI, "stream": "yes"})
    assert r.status_code == 400 and r.json()["error"].startswith("stream")


# ---- members and lanes --------------------------------------------------------------------------


def test_no_token_is_401(server, http):
    error = refused(client_for(server, None).list)
    assert error.status_code == 401
    r = http.post("/api/chat", json={"model": "x", "messages": HI})
    assert r.status_code == 401 and isinstance(r.json()["error"], str)


def finished(authed, lane: str) -> int:
    return lanes(authed)[lane]["finished"]


def test_lane_header_routes_the_request(server, token, served, authed):
    before = finished(authed, "voice")
    client_for(server, token, **{"X-HomeAI-Lane": "voice"}).chat(model=served, messages=HI, options=SHORT)
    assert wait_for(lambda: finished(authed, "voice") > before)
    error = refused(client_for(server, token, **{"X-HomeAI-Lane": "nowhere"}).chat, model=served, messages=HI)
    assert error.status_code == 400 and "nowhere" in error.error


def test_a_members_default_lane_is_used_unless_the_header_names_one(cfg, server, served, authed):
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            ha_token = add_member(session, name="ha", lane="summaries", lanes=["summaries", "voice"])[1]
    finally:
        engine.dispose()
    before = finished(authed, "summaries")
    client_for(server, ha_token).chat(model=served, messages=HI, options=SHORT)
    assert wait_for(lambda: finished(authed, "summaries") > before)
    before_voice = finished(authed, "voice")
    client_for(server, ha_token, **{"X-HomeAI-Lane": "voice"}).chat(model=served, messages=HI, options=SHORT)
    assert wait_for(lambda: finished(authed, "voice") > before_voice)


def test_a_full_lane_queue_is_429_with_retry_after(server, token, served, authed):
    summaries = client_for(server, token, **{"X-HomeAI-Lane": "summaries"})
    with ThreadPoolExecutor(1) as pool:
        with server.program.engine.background_paused():  # the summaries lane waits: its one queue place is taken
            waiting = pool.submit(summaries.generate, model=served, prompt="Hi", options=SHORT)
            assert wait_for(lambda: lanes(authed)["summaries"]["queued"] == 1)
            r = authed.post("/api/generate", json={"model": served, "prompt": "Hi", "stream": False},
                            headers={"X-HomeAI-Lane": "summaries"})
            assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1 and "full" in r.json()["error"]
        assert waiting.result(TIMEOUT).done  # served once the lane moves again
