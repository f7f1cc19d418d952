"""Tools on the voice socket: real speech asks for a device to be turned on, the answer is a
`response.tool_calls` event for each call as soon as it is written whole, the client answers each
with `tool.result`, and the turn ends in words.

Run: .venv/bin/python -m pytest tests/voice/test_voice_tools.py
"""

from __future__ import annotations

import jsonschema
import pytest

from tests.api.conftest import api_config
from tests.voice.conftest import heard, serve, voice_client

pytestmark = [pytest.mark.model, pytest.mark.anyio]

TURN_ON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 32},
                                            "area": {"type": "string", "maxLength": 32},
                                            "domain": {"enum": ["light", "switch"]}}, "required": ["name"]}
TOOLS = [{"type": "function", "function": {"name": "HassTurnOn", "description": "Turns on a device",
                                           "parameters": TURN_ON}},
         {"type": "function", "function": {"name": "GetLiveContext", "description": "The home's current state"}}]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, lanes={"voice": {"max_tokens": 128}})


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve(cfg, runner, stt) as running:
        yield running


async def test_a_tool_call_then_its_result_then_the_spoken_answer(server, utterance):
    async with voice_client(server) as client:
        await client.start(tools=TOOLS, tool_choice="required")
        await client.audio(utterance.raw_16k)
        await client.send(type="audio.end")
        events = await client.until("response.tool_calls", "response.done", "error")
        transcript = next(e for e in events if e["type"] == "transcript.final")
        assert heard(transcript["text"])
        calls = events[-1]
        assert calls["type"] == "response.tool_calls", events[-2:]
        for call in calls["tool_calls"]:
            assert call["id"] and call["name"] in ("HassTurnOn", "GetLiveContext")
            if call["name"] == "HassTurnOn":
                jsonschema.validate(call["arguments"], TURN_ON)
        while events[-1]["type"] == "response.tool_calls":  # the model may call again after results, a few times
            for call in events[-1]["tool_calls"]:
                await client.send(type="tool.result", tool_call_id=call["id"], content={"success": True})
            events = await client.until("response.tool_calls", "response.done", "error")
        done = events[-1]
        assert done["type"] == "response.done", events[-2:]
        assert done["finish_reason"] in ("stop", "length") and done["text"].strip()
        assert done["text"] == "".join(e["text"] for e in events if e["type"] == "response.delta")


async def test_each_call_is_sent_as_soon_as_it_is_whole(server, utterance):
    # With only a call without arguments to make, the small model writes it more than once in one
    # answer: each goes out on its own as it closes, and its result may go back at once.
    async with voice_client(server) as client:
        await client.start(tools=TOOLS[1:], tool_choice="required")
        await client.audio(utterance.raw_16k)
        await client.send(type="audio.end")
        events = await client.until("response.tool_calls", "response.done", "error")
        while events[-1]["type"] == "response.tool_calls":
            assert [call["name"] for call in events[-1]["tool_calls"]] == ["GetLiveContext"], events[-1]
            await client.send(type="tool.result", tool_call_id=events[-1]["tool_calls"][0]["id"], content="all off")
            events = await client.until("response.tool_calls", "response.done", "error")
        assert events[-1]["type"] == "response.done", events[-2:]


async def test_a_result_with_no_call_waiting_is_an_error(server):
    async with voice_client(server) as client:
        await client.start(tools=TOOLS)
        await client.send(type="tool.result", content="nothing asked")
        await client.error("no_tool_call")


@pytest.mark.parametrize("tools", [
    [{"type": "function", "function": {"description": "no name"}}],
    [{"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {"a": {"type": 1}}}}}],
    "HassTurnOn",
])
async def test_bad_tools_are_refused_at_session_start(server, tools):
    async with voice_client(server) as client:
        await client.send(type="session.start", sample_rate=16000, tools=tools)
        event = await client.error("invalid_tools")
        assert event["message"]

