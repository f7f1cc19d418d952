"""A Home Assistant voice turn end to end, on a real daemon with its Wyoming listener: real espeak-ng
speech through the `wyoming` client gives the transcript, which goes to `/api/chat` through the
`ollama` client the way Home Assistant's Ollama integration sends it (a long stable system prompt,
its tools, the history, `num_ctx` 8192, `keep_alive` "-1s", streamed), as member `ha` whose
default lane is voice. Two turns: the second reads its long prefix from the prompt cache.

Whether the model calls a tool or answers in words is not asserted (tests/api/test_tools.py owns
tool behaviour); a tool call is answered and followed up, as Home Assistant's tool loop does.
Home Assistant's loop itself runs too: ten rounds of calls and their `{"data", "error"}` results,
its tools named with their `intent__` and `homeassistant__` prefixes.

Run: .venv/bin/python -m pytest tests/api/test_home_assistant.py
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

import httpx
import ollama
import pytest

from homeai.bench.assistant_bench import TOOLS, chat_kwargs, system_prompt, tool_results
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.api.conftest import TIMEOUT, api_config, lanes, wait_for
from tests.speech.conftest import synthesise
from tests.wyoming.conftest import serve, transcribe

pytestmark = pytest.mark.model

# What each turn says, and words of it the transcript must hold at least one of (tiny.en on espeak-ng).
TURNS = [("turn on the kitchen lights", ("kitchen", "light")),
         ("turn off the lamp in the bedroom", ("lamp", "bedroom", "off"))]
SYSTEM = system_prompt(40, datetime(2026, 12, 1, 7, 30))


@pytest.fixture(scope="module")
def cfg(module_tmp):
    """Home Assistant asks no length: the voice lane's answers are capped at 48 tokens (as a household
    may set it), so a turn's time is not its sampled answer's length. (At 32 a sampled tool call,
    `<tool_call>` and its JSON, was cut before it closed now and then: neither words nor a call.)"""
    return api_config(module_tmp, auth={"required": True}, wyoming={"enabled": True, "port": 0},
                      lanes={"voice": {"max_tokens": 48}})


@pytest.fixture(scope="module")
def served(cfg, runner, stt):
    with serve(cfg, runner, stt) as running:
        yield running


@pytest.fixture(scope="module")
def ha_token(cfg, served) -> str:
    """Member `ha` on the voice lane, as `homeai members add ha --lane voice` makes it."""
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return add_member(session, name="ha", lane="voice")[1]
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def ha(served, ha_token) -> ollama.Client:
    server, _port = served
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {ha_token}"}, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def authed(served, ha_token):
    server, _port = served
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {ha_token}"}) as c:
        yield c


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> list[bytes]:
    return [synthesise(text, tmp_path_factory.mktemp("home_assistant")).raw_16k for text, _words in TURNS]


def voice_cache(http) -> dict:
    return lanes(http)["voice"]["prompt_cache"]


def chat_turn(ha, model: str, history: list[dict]) -> tuple[list, dict]:
    """One streamed `/api/chat` as Home Assistant sends it: its parts (one per NDJSON line) and the
    assistant's message for the history."""
    parts = list(ha.chat(**chat_kwargs(model, history)))
    assert parts and all(not p.done for p in parts[:-1]) and parts[-1].done, "lines, the last one done"
    assert parts[-1].done_reason in ("stop", "length") and parts[-1].prompt_eval_count > 0
    calls = [{"function": {"name": c.function.name, "arguments": dict(c.function.arguments)}}
             for p in parts for c in p.message.tool_calls or ()]
    content = "".join(p.message.content or "" for p in parts)
    assert content or calls, "an answer: words or a tool call"
    return parts, {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


def test_two_spoken_turns_the_second_served_from_the_prompt_cache(served, ha, authed, speech, runner):
    _server, port = served
    model = ha.list().models[0].model
    history = [{"role": "system", "content": SYSTEM}]
    cached_by_turn = []
    for (_text, words), pcm in zip(TURNS, speech):
        transcript = asyncio.run(transcribe(port, pcm, 16000))
        assert any(w in transcript.lower() for w in words), transcript
        history.append({"role": "user", "content": transcript})

        before = voice_cache(authed)
        _parts, message = chat_turn(ha, model, history)
        after = wait_for(lambda: (c := voice_cache(authed))["requests"] > before["requests"] and c)
        assert after, "the turn went to the voice lane: ha's default lane"
        cached_by_turn.append(after["cached_tokens"] - before["cached_tokens"])

        history.append(message)
        if "tool_calls" in message:  # Home Assistant runs the calls and asks again with their results
            history += tool_results(message)
            history.append(chat_turn(ha, model, history)[1])

    system_tokens = len(runner.tokenize(SYSTEM))
    assert cached_by_turn[1] >= 0.8 * system_tokens, (cached_by_turn, system_tokens)


# Home Assistant names each tool after the API that gives it.
PREFIXED = {"HassTurnOn": "intent__HassTurnOn", "HassTurnOff": "intent__HassTurnOff",
            "GetLiveContext": "homeassistant__GetLiveContext"}
HA_TOOLS = [{**t, "function": {**t["function"], "name": PREFIXED[t["function"]["name"]]}} for t in TOOLS]
ROOMS = ["kitchen", "living room", "bedroom", "hall", "office", "garage", "porch", "bathroom", "attic", "garden"]


def result(call: dict, room: str) -> dict:
    """Home Assistant's answer to a call: its tool's result as JSON `{data, error}`."""
    data = {"success": [{"name": room, "type": "area", "id": room.replace(" ", "_")}], "failed": []}
    return {"role": "tool", "tool_name": call["function"]["name"], "content": json.dumps({"data": data, "error": None})}


def test_ten_rounds_of_calls_and_results(ha):
    """Each round sends the history so far, every earlier call with its result, and gets an answer:
    words, or calls of the offered tools by their prefixed names. The round's calls are the model's
    own when it makes some; else a recorded call stands in for it (this small model may answer in
    words), so that every round holds one more call and result than the one before."""
    model = ha.list().models[0].model
    history = [{"role": "system", "content": system_prompt(6, datetime(2026, 12, 1, 7, 30))},
               {"role": "user", "content": "Turn on the lights in every room, one room at a time."}]
    prompt_tokens, own_calls = [], 0
    for room in ROOMS:
        parts = list(ha.chat(**ha_round(model, history)))
        assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
        calls = [{"function": {"name": c.function.name, "arguments": dict(c.function.arguments)}}
                 for p in parts for c in p.message.tool_calls or ()]
        assert {c["function"]["name"] for c in calls} <= set(PREFIXED.values()), calls
        own_calls += len(calls)
        calls = calls or [{"function": {"name": "intent__HassTurnOn",
                                        "arguments": {"area": room, "domain": ["light"]}}}]
        content = "".join(p.message.content or "" for p in parts)
        history.append({"role": "assistant", "content": content, "tool_calls": calls})
        history += [result(call, room) for call in calls]
        prompt_tokens.append(parts[-1].prompt_eval_count)
    assert len(prompt_tokens) == 10 and all(a < b for a, b in zip(prompt_tokens, prompt_tokens[1:])), prompt_tokens
    final = list(ha.chat(**ha_round(model, history)))
    assert final[-1].done and final[-1].prompt_eval_count > prompt_tokens[-1]
    print(f"the model's own calls: {own_calls}; prompt tokens by round: {prompt_tokens}")


def ha_round(model: str, history: list[dict]) -> dict:
    """What Home Assistant sends, its prefixed tools, with a bounded answer (a quick test: 6
    devices in the system prompt, 24 tokens an answer)."""
    kwargs = {**chat_kwargs(model, history), "tools": HA_TOOLS}
    return {**kwargs, "options": {**kwargs["options"], "num_predict": 24}}
