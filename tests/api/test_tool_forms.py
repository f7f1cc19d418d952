"""A family's own call form end to end: the server over SmolLM2 with a published template in place
of its own (as `model.chat_template` names a file), so the tool plan writes, holds, parses and
streams that family's markup through the real `openai` and `ollama` clients: Qwen2.5's hermes
`<tool_call>` (ChatML, SmolLM2's own turns), Mistral Small 3.2's `[TOOL_CALLS]NAME[ARGS]`, whose
template refuses any call id that is not 9 letters and digits, and Ollama's calls carry none, and
gpt-oss's harmony, whose call passes the thinking splitter first.

Run: .venv/bin/python -m pytest tests/api/test_tool_forms.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import ollama
import openai
import pytest

from homeai.engine import template
from tests.api.conftest import TIMEOUT, add_token, api_config, serve
from tests.tools.replies import TOOLS as HA_TOOLS

pytestmark = pytest.mark.model

TEMPLATES = Path(__file__).resolve().parents[1] / "engine" / "templates"
FORMS = {"hermes": "qwen2.5-instruct.jinja", "mistral": "Mistral-Small-3.2-24B-Instruct-2506.jinja",
         "harmony": "openai-gpt-oss-120b.jinja"}
# Short, for a quick test on a small box: Mistral's template's own system prompt is ~600 tokens.
ASK = [{"role": "system", "content": "You control the home."},
       {"role": "user", "content": "Dim the kitchen light to 40 percent."}]
TOOLS = [t for t in HA_TOOLS if t["function"]["name"] in ("intent__HassLightSet", "homeassistant__GetLiveContext")]
GREEDY = {"temperature": 0, "seed": 3, "max_tokens": 80}
RESULT = json.dumps({"data": {"success": [{"name": "kitchen light", "type": "entity"}], "failed": []}, "error": None})


@pytest.fixture(scope="module", params=sorted(FORMS))
def served(request, module_tmp, runner):
    """(form, server, config) with the family's template in place of SmolLM2's own, for this module."""
    own = runner.chat
    runner.chat = template.choose(None, bos_token=own.template.bos_token, eos_token=own.template.eos_token,
                                  configured=str(TEMPLATES / FORMS[request.param]))
    tmp = module_tmp / request.param
    tmp.mkdir()
    cfg = api_config(tmp, scheduler={"prompt_cache": False})
    try:
        with serve(cfg, runner) as server:
            yield request.param, server, cfg
    finally:
        runner.chat = own


@pytest.fixture(scope="module")
def client(served):
    _form, server, cfg = served
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=add_token(cfg, "alice"), timeout=TIMEOUT,
                       max_retries=0) as c:
        yield c


def schema_of(name: str) -> dict:
    return next(t["function"].get("parameters", {}) for t in TOOLS if t["function"]["name"] == name)


@pytest.fixture(scope="module")
def forced(client) -> tuple[dict, str]:
    """A forced call, streamed and reassembled: its calls by index and the finish reason."""
    calls, reason = {}, None
    # One call: left free, this small model repeats a call up to the limit (tests/tools/ check parallel ones)
    for chunk in client.chat.completions.create(model="homeai", messages=ASK, tools=TOOLS, tool_choice="required",
                                                parallel_tool_calls=False, stream=True, **GREEDY):
        delta = chunk.choices[0].delta if chunk.choices else None
        for part in (delta.tool_calls or ()) if delta else ():
            call = calls.setdefault(part.index, {"id": part.id, "name": part.function.name, "arguments": ""})
            call["arguments"] += part.function.arguments or ""
        reason = (chunk.choices[0].finish_reason if chunk.choices else None) or reason
    return calls, reason


def test_a_forced_call_streams_in_the_forms_own_markup(served, forced):
    form, _server, _cfg = served
    calls, reason = forced
    assert reason == "tool_calls" and len(calls) == 1
    for call in calls.values():
        assert call["name"] in {t["function"]["name"] for t in TOOLS}, call  # `__` names unchanged
        jsonschema.validate(json.loads(call["arguments"]), schema_of(call["name"]))
        if form == "mistral":
            assert re.fullmatch(r"[A-Za-z0-9]{9}", call["id"]), "an id Mistral's template takes back"


def test_the_call_and_its_result_go_back_and_are_answered(client, forced):
    """The template renders them (Mistral's with the 9-character id the call came with): the prompt
    grows by them. What this small model answers, under another family's turns, is not asserted."""
    call = forced[0][0]
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]},
               {"role": "tool", "tool_call_id": call["id"], "content": RESULT}]
    short = {**GREEDY, "max_tokens": 8}
    reply = client.chat.completions.create(model="homeai", messages=history, tools=TOOLS, tool_choice="none", **short)
    alone = client.chat.completions.create(model="homeai", messages=ASK, tools=TOOLS, tool_choice="none", **short)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.choices[0].message.tool_calls is None
    assert reply.usage.prompt_tokens > alone.usage.prompt_tokens + len(RESULT) // 8


def test_ollamas_calls_without_ids_are_taken(served):
    """Home Assistant's history through the `ollama` client: a call and its result, neither with an
    id (Mistral's template is given ids of its own), then the next ask."""
    _form, server, cfg = served
    ha = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {add_token(cfg, 'ha')}"}, timeout=TIMEOUT)
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "intent__HassLightSet", "arguments": {"name": "kitchen light", "brightness": 40}}}]},
        {"role": "tool", "tool_name": "intent__HassLightSet", "content": RESULT},
        {"role": "assistant", "content": "The kitchen light is at 40 percent."},
        {"role": "user", "content": "Thanks. And the hall?"}]
    parts = list(ha.chat(model=ha.list().models[0].model, messages=history, tools=TOOLS, stream=True,
                         options={"num_predict": 24, "temperature": 0}))
    assert parts[-1].done and parts[-1].prompt_eval_count > 0
    for part in parts:
        for call in part.message.tool_calls or ():
            jsonschema.validate(dict(call.function.arguments), schema_of(call.function.name))
