"""Lanes a member may use (issue 26): any other lane is refused with a 403 naming the allowed
ones, on every route, with the client each route's users have: the `openai` package, the
`ollama` package, `httpx` for the household chat, a websocket for `/v1/voice`, and the
`wyoming` package for the Wyoming listener, whose member (`wyoming.member`) must be allowed voice.

A real server (auth on, short answers) over the session's model and speech model; members are
written into its store as `homeai members add` writes them.

Run: .venv/bin/python -m pytest tests/security/test_member_lanes.py
"""

from __future__ import annotations

import asyncio
import json

import httpx
import ollama
import openai
import pytest
from websockets.exceptions import ConnectionClosed
from wyoming.asr import Transcript
from wyoming.audio import AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error

from homeai.store import members
from homeai.store.db import make_engine, make_sessionmaker
from tests.api.conftest import TIMEOUT, api_config, serve
from tests.security.conftest import SHORT, event, voice_socket

pytestmark = pytest.mark.model

BOB_LANES = "chat, summaries, indexing, embeddings"  # a new member's lanes, as a refusal names them
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, server={"max_output_tokens": 4},
                      lanes={"voice": SHORT, "chat": SHORT, "summaries": SHORT}, wyoming={"enabled": True, "port": 0, "member": "ha"})


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve(cfg, runner, stt=stt) as running:
        yield running


def store(cfg, change):
    """Run `change(session)` on the server's store, as the CLI does from its own process."""
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return change(session)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def tokens(cfg, server) -> dict[str, str]:
    """bob: a new member's defaults; ha: `--lane voice`; nochat: voice only."""
    def add(session):
        return {"bob": members.add_member(session, name="bob")[1],
                "ha": members.add_member(session, name="ha", lane="voice")[1],
                "nochat": members.add_member(session, name="nochat", lanes=["voice"])[1]}
    return store(cfg, add)


def assert_names_bobs_lanes(message: str, lane: str = "voice") -> None:
    assert f"may not use lane '{lane}'" in message and BOB_LANES in message, message


# ---- /v1, with the openai package -----------------------------------------------------------


@pytest.fixture(scope="module")
def bob_openai(server, tokens):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=tokens["bob"], timeout=TIMEOUT, max_retries=0) as client:
        yield client


def test_openai_another_lane_is_403_naming_the_allowed_ones(bob_openai):
    model = bob_openai.models.list().data[0].id
    answer = bob_openai.chat.completions.create(model=model, messages=HI, max_tokens=2)  # chat: allowed
    assert answer.choices[0].message is not None
    refusals = [
        lambda: bob_openai.chat.completions.create(model=model, messages=HI, extra_headers={"X-HomeAI-Lane": "voice"}),
        lambda: bob_openai.chat.completions.create(model=model, messages=HI, extra_body={"lane": "voice"}),
        lambda: bob_openai.completions.create(model=model, prompt="Hi", extra_body={"lane": "voice"}),
        lambda: bob_openai.embeddings.create(model=model, input="Hi", extra_body={"lane": "voice"}),
    ]
    for call in refusals:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            call()
        assert refused.value.status_code == 403
        assert refused.value.code == "lane_not_allowed"
        assert_names_bobs_lanes(refused.value.message)


def test_an_admin_may_use_every_lane(server, cfg):
    admin = store(cfg, lambda session: members.add_member(session, name="root", admin=True)[1])
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=admin, timeout=TIMEOUT, max_retries=0) as client:
        model = client.models.list().data[0].id
        answer = client.chat.completions.create(model=model, messages=HI, max_tokens=2, extra_body={"lane": "voice"})
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_an_unknown_lane_is_still_a_400(bob_openai):
    with pytest.raises(openai.BadRequestError, match="unknown lane 'nowhere'"):
        bob_openai.chat.completions.create(model="m", messages=HI, extra_body={"lane": "nowhere"})


# ---- Ollama's API, with the ollama package --------------------------------------------------


def ollama_client(server, token: str, **headers) -> ollama.Client:
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {token}", **headers}, timeout=TIMEOUT)


def test_ollama_another_lane_is_a_403_response_error(server, tokens):
    model, embed_model = server.program.model_id("generate"), server.program.model_id("embed")
    voice = ollama_client(server, tokens["bob"], **{"X-HomeAI-Lane": "voice"})
    for call in (lambda: voice.chat(model=model, messages=HI),
                 lambda: voice.generate(model=model, prompt="Hi"),
                 lambda: voice.embed(model=embed_model, input="Hi")):
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 403
        assert_names_bobs_lanes(refused.value.error)


def test_ollama_a_voice_member_gets_voice_by_default(server, tokens):
    reply = ollama_client(server, tokens["ha"]).chat(model=server.program.model_id("generate"), messages=HI,
                                                     options={"num_predict": 2})
    assert reply.done


def test_a_default_lane_the_member_may_not_use_is_a_403(cfg, server, tokens):
    """A default lane left over (written before lanes existed, or by hand) does not open the lane."""
    def stale_default(session):
        member, token = members.add_member(session, name="stale")
        member.settings.default_lane = "voice"  # past the store's own check
        session.commit()
        return token
    token = store(cfg, stale_default)
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client(server, token).chat(model=server.program.model_id("generate"), messages=HI)
    assert refused.value.status_code == 403 and "may not use lane 'voice'" in refused.value.error


# ---- the household chat, with httpx ---------------------------------------------------------


def test_household_answers_need_the_chat_lane(server, tokens):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {tokens['nochat']}"}) as http:
        conversation = http.post("/api/conversations", json={"title": "lights"})
        assert conversation.status_code == 201  # a conversation is not a lane: listing and making them stay open
        r = http.post(f"/api/conversations/{conversation.json()['id']}/messages", json={"content": "Hi"})
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert error["code"] == "lane_not_allowed" and "may not use lane 'chat'" in error["message"]
        assert "(allowed: voice)" in error["message"]
        assert http.get(f"/api/conversations/{conversation.json()['id']}").json()["messages"] == []  # nothing stored


# ---- the voice socket ------------------------------------------------------------------------


def test_voice_socket_refuses_a_member_without_voice(server, tokens):
    with voice_socket(server, tokens["bob"]) as ws:
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        error = event(ws)
        assert error["type"] == "error" and error["code"] == "lane_not_allowed", error
        assert_names_bobs_lanes(error["message"])
        with pytest.raises(ConnectionClosed) as closed:
            event(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    with voice_socket(server, tokens["ha"]) as ws:  # a member with voice starts as before
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        assert event(ws)["type"] == "session.ready"


# ---- Wyoming, with the wyoming package ------------------------------------------------------


async def utterance(port: int):
    """An empty utterance, as Home Assistant frames one: the event it gets back."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        await client.write_event(AudioStop().event())
        return await asyncio.wait_for(client.read_event(), TIMEOUT)


def test_wyoming_acts_as_its_member_who_must_be_allowed_voice(cfg, server, tokens):
    port = server.app.state.wyoming.port
    answer = asyncio.run(utterance(port))
    assert Transcript.is_type(answer.type), answer  # ha (wyoming.member) may use voice

    def chat_only(session):
        members.set_default_lane(session, name="ha", lane=None)
        members.set_lanes(session, name="ha", lanes=["chat"])

    def voice_again(session):
        members.set_lanes(session, name="ha", lanes=["voice", "chat"])
        members.set_default_lane(session, name="ha", lane="voice")

    store(cfg, chat_only)
    try:
        answer = asyncio.run(utterance(port))  # applies to the next utterance, no restart
        assert Error.is_type(answer.type), answer
        error = Error.from_event(answer)
        assert error.code == "lane_not_allowed" and "may not use lane 'voice' (allowed: chat)" in error.text
    finally:
        store(cfg, voice_again)


# ---- a body `lane`, on every route (issue 55): honoured when the member may use it, as on /v1 --


def post(server, token: str, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}) as http:
        return http.post(path, json=body)


def ollama_bodies(server) -> dict[str, dict]:
    model, embed_model = server.program.model_id("generate"), server.program.model_id("embed")
    return {"/api/chat": {"model": model, "messages": HI, "stream": False, "options": {"num_predict": 2}},
            "/api/generate": {"model": model, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
            "/api/embed": {"model": embed_model, "input": "Hi"},
            "/api/embeddings": {"model": embed_model, "prompt": "Hi"}}


def test_ollama_a_body_lane_the_member_may_not_use_is_a_403_an_unknown_one_a_400(server, tokens):
    """The `ollama` package sends no field of homeai's: httpx writes the body as any client may."""
    for path, body in ollama_bodies(server).items():
        refused = post(server, tokens["bob"], path, {**body, "lane": "voice"})
        assert refused.status_code == 403, (path, refused.text)
        assert_names_bobs_lanes(refused.json()["error"])
        unknown = post(server, tokens["bob"], path, {**body, "lane": "nowhere"})
        assert unknown.status_code == 400 and "unknown lane 'nowhere'" in unknown.json()["error"], (path, unknown.text)


def test_ollama_a_body_lane_the_member_may_use_is_honoured(server, tokens):
    """ha's default lane is voice; a body lane moves the request to chat, as the header does (the
    engine's count of each lane's generations since it started shows it)."""
    def served(lane: str) -> int:
        return server.program.engine.state().lanes[lane].prompt_cache.requests

    before = served("chat"), served("voice")
    for path in ("/api/chat", "/api/generate"):
        reply = post(server, tokens["ha"], path, {**ollama_bodies(server)[path], "lane": "chat"})
        assert reply.status_code == 200 and reply.json()["done"], reply.text
    assert (served("chat"), served("voice")) == (before[0] + 2, before[1])


def test_ollama_client_a_lane_in_the_model_name_is_refused_the_same_way(server, tokens):
    bob = ollama_client(server, tokens["bob"])
    with pytest.raises(ollama.ResponseError) as refused:
        bob.chat(model=f"{server.program.model_id('generate')}:voice", messages=HI)
    assert refused.value.status_code == 403
    assert_names_bobs_lanes(refused.value.error)
    assert bob.chat(model=server.program.model_id("generate"), messages=HI, options={"num_predict": 2}).done


def test_household_a_body_lane_is_honoured_or_refused_as_on_v1(server, tokens):
    """nochat may use voice alone: its answers come on voice when asked; chat (the default) and a lane
    that does not exist are refused, on send and on regenerate alike, and nothing is stored for them."""
    token = tokens["nochat"]
    conversation = post(server, token, "/api/conversations", {"title": "lanes"}).json()["id"]
    messages, again = f"/api/conversations/{conversation}/messages", f"/api/conversations/{conversation}/regenerate"
    answered = post(server, token, messages, {"content": "Hi", "max_tokens": 2, "lane": "voice"})
    assert answered.status_code == 200 and "response.done" in answered.text, answered.text
    for path, body in ((messages, {"content": "Hi"}), (again, {})):
        refused = post(server, token, path, {**body, "lane": "chat"})
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "lane_not_allowed" and "(allowed: voice)" in error["message"], error
        unknown = post(server, token, path, {**body, "lane": "nowhere"})
        assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_lane", unknown.text
    assert post(server, tokens["bob"], messages, {"content": "Hi", "lane": "voice"}).status_code == 403
    regenerated = post(server, token, again, {"max_tokens": 2, "lane": "voice"})
    assert regenerated.status_code == 200 and "response.done" in regenerated.text, regenerated.text
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}) as http:
        stored = http.get(f"/api/conversations/{conversation}").json()["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]  # the refusals stored nothing
