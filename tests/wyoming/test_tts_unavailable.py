"""Without text to speech (no voice loaded) Wyoming lists no tts program, each synthesis gets an
`error` event `tts_unavailable` while the connection goes on, and speech to text is unaffected.

Run: .venv/bin/python -m pytest tests/wyoming/test_tts_unavailable.py
"""

from __future__ import annotations

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import Synthesize, SynthesizeStart

from tests.api.conftest import api_config
from tests.wyoming.conftest import heard, read, serve, transcribe

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def port(module_tmp, runner, stt):
    cfg = api_config(module_tmp, wyoming={"enabled": True, "port": 0}, tts={"enabled": False})
    with serve(cfg, runner, stt) as (_server, listening):  # no voice handed in
        yield listening


async def test_describe_lists_speech_to_text_only(port):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        info = Info.from_event(await read(client))
    assert info.tts == [] and [program.name for program in info.asr] == ["homeai"]


@pytest.mark.parametrize("event", [Synthesize(text="Hello there."), SynthesizeStart()], ids=["whole", "stream"])
async def test_synthesis_is_an_error_and_the_connection_goes_on(port, event):
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(event.event())
        answer = await read(client)
        assert Error.is_type(answer.type) and Error.from_event(answer).code == "tts_unavailable", answer
        await client.write_event(Ping(text="still here").event())
        assert Pong.is_type((await read(client)).type)


async def test_speech_to_text_still_serves(port, utterance):
    assert heard(await transcribe(port, utterance.raw_16k, 16000))
