"""A spoken tool-call turn on the voice socket: the calls are never spoken, the answer in words is.

A real spoken question with tools and `tool_choice: "required"`: the rounds that end in
`response.tool_calls` send no audio frame; once every call has its `tool.result`, the turn ends
in words, and those words are what piper says (heard back by faster-whisper).

Run: .venv/bin/python -m pytest tests/voice/test_voice_speak_tools.py
"""

from __future__ import annotations

import pytest

from homeai.speech.sentences import speakable
from tests.api.conftest import api_config
from tests.api.conftest import serve as api_serve
from tests.conftest import heard_share
from tests.voice.conftest import voice_client
from tests.voice.test_voice_speak import kinds, listen, speak_question
from tests.voice.test_voice_tools import TOOLS

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def server(module_tmp, runner, stt, tts):
    cfg = api_config(module_tmp, lanes={"voice": {"max_tokens": 128}})
    with api_serve(cfg, runner, stt=stt, tts=tts) as running:
        yield running


async def test_a_tool_call_turn_speaks_its_answer_in_words_only(server, utterance, stt, tts):
    async with voice_client(server) as client:
        await client.start(speak=True, tools=TOOLS, tool_choice="required")
        await speak_question(client, utterance)
        messages = await listen(client, "response.tool_calls", "response.done", "error")
        rounds = 0
        while messages[-1]["type"] == "response.tool_calls":
            assert "frame" not in kinds(messages), kinds(messages)  # a call is not spoken
            rounds += 1
            for call in messages[-1]["tool_calls"]:
                await client.send(type="tool.result", tool_call_id=call["id"], content={"success": True})
            messages = await listen(client, "response.tool_calls", "response.done", "error")
        assert rounds >= 1
        done = messages[-1]
        assert done["type"] == "response.done", kinds(messages)[-3:]
        said = speakable(done["text"])
        frames = b"".join(m for m in messages if isinstance(m, bytes))
        assert said and frames, (done["text"], kinds(messages))
        assert kinds(messages)[-2:] == ["response.audio.done", "response.done"]
        share, heard = heard_share(stt, frames, tts.sample_rate(), said)
        # The small model's words after its calls often name the tool ("HassTurnOn"), which speech
        # recognition hears as words of its own ("has turned on"): half the words, not the usual 0.7.
        assert share >= 0.5, (said, heard)
