"""Auth required: the voice socket takes the member's token as `?token=`, an Authorization
header or `session.start`'s `token`, and closes with 4401 without a valid one.

Run: .venv/bin/python -m pytest tests/voice/test_voice_auth.py
"""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.api.conftest import add_token, api_config
from tests.voice.conftest import TIMEOUT, poll, voice_client
from tests.voice.conftest import serve as serve_voice

pytestmark = [pytest.mark.model, pytest.mark.anyio]

KITCHEN = "http://kitchen.local:3000"
MAX_SOCKETS = 2


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True},
                      server={"cors_origins": [KITCHEN], "max_websockets_per_member": MAX_SOCKETS})


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve_voice(cfg, runner, stt) as running:
        yield running


@pytest.fixture(scope="module")
def alice(cfg, server):
    return add_token(cfg, "alice")


async def closed_with(client, code: int) -> None:
    with pytest.raises(ConnectionClosed):
        await client.event()
    assert client.ws.close_code == code


async def test_no_token_closes_with_4401(server):
    async with voice_client(server) as client:
        await client.send(type="session.start", sample_rate=16000)
        await closed_with(client, 4401)


@pytest.mark.parametrize("message", [b"\x00\x00" * 320, "{not json", json.dumps({"type": "audio.end"})])
async def test_anything_before_a_token_closes_with_4401(server, message):
    async with voice_client(server) as client:
        await client.ws.send(message)
        await closed_with(client, 4401)


async def test_an_invalid_query_token_closes_with_4401(server):
    async with voice_client(server, "?token=hai_not-a-real-token") as client:
        await closed_with(client, 4401)


async def test_an_invalid_token_in_session_start_closes_with_4401(server, alice):
    async with voice_client(server) as client:
        await client.send(type="session.start", sample_rate=16000, token="hai_wrong")
        await closed_with(client, 4401)


async def test_query_token(server, alice):
    async with voice_client(server, f"?token={alice}") as client:
        assert (await client.start())["member"] == "alice"


async def test_token_in_session_start(server, alice):
    async with voice_client(server) as client:
        assert (await client.start(token=alice))["member"] == "alice"


async def test_authorization_header(server, alice):
    async with voice_client(server, additional_headers={"Authorization": f"Bearer {alice}"}) as client:
        assert (await client.start())["member"] == "alice"


async def test_a_page_of_another_site_is_refused(server, alice):
    with pytest.raises(InvalidStatus) as refused:
        async with voice_client(server, f"?token={alice}", origin="http://evil.example"):
            pass
    assert refused.value.response.status_code == 403
    async with voice_client(server, f"?token={alice}", origin=KITCHEN) as client:  # a configured origin
        await client.start()


async def test_a_member_may_hold_only_so_many_sockets(server, cfg):
    token = add_token(cfg, "carol")
    async with voice_client(server, f"?token={token}") as first, voice_client(server) as second:
        await first.start()
        await second.start(token=token)
        async with voice_client(server, f"?token={token}") as third:
            await closed_with(third, 4429)
    async with voice_client(server, f"?token={token}") as again:  # closing gave the sockets back
        await again.start()
    assert await poll(lambda: server.runtime.websockets.num_held("carol") == 0)


def test_transcriptions_need_a_token(server, alice, utterance):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        files = {"file": ("q.wav", utterance.wav_16k, "audio/wav")}
        assert http.post("/v1/audio/transcriptions", files=files).status_code == 401
        r = http.post("/v1/audio/transcriptions", files=files, headers={"Authorization": f"Bearer {alice}"})
        assert r.status_code == 200 and "kitchen" in r.json()["text"].lower()
