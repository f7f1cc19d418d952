"""Lanes and fair share for clients that cannot send homeai's lane header (issue 27), with the real
clients: the `openai` and `ollama` packages, and Open WebUI's recorded bodies.

* The served model is listed under lane names, `<id>:<lane>`, for the lanes a member may use; a
  request naming one runs on that lane (checked in `/api/lanes`' finished counts), wins over the
  lane header, conflicts with a body `lane` (400), and is refused (403) to a member without the lane.
  The task rule is off here (`background_task_lane = ""`): the name alone moves Open WebUI's tasks.
* A trusted proxy member's users (`X-OpenWebUI-User-Id`) are fair-share keys of their own,
  `owui/<user>`, in what the engine records per key; another member's header is ignored; a proxy's
  bad value is a 400 naming the header.

Run: .venv/bin/python -m pytest tests/api/test_lane_names.py
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.api.conftest import TIMEOUT, api_config, lanes

pytestmark = pytest.mark.model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
HI = [{"role": "user", "content": "Hi"}]
SHORT = {"num_predict": 4, "temperature": 0}
USER_HEADER = "X-OpenWebUI-User-Id"
ALICE, BOB = "8c1f3a52-7d0e-4b8e-9a51-2f6c0d9e1b27", "0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f"


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, clients={"background_task_lane": ""},
                      lanes={"summaries": {"max_tokens": 32}})  # the recorded tasks ask no length


@pytest.fixture(scope="module")
def tokens(cfg, server) -> dict[str, str]:
    """owui: a trusted proxy with a member's default lanes; bob: such a member; kid: chat only (the
    server has made the store)."""
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as s:
            return {"owui": add_member(s, name="owui", proxy=True)[1], "bob": add_member(s, name="bob")[1],
                    "kid": add_member(s, name="kid", lanes=["chat"])[1]}
    finally:
        engine.dispose()


def oai(server, token: str, **headers) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0,
                         default_headers=headers or None)


def olla(server, token: str, **headers) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}", **headers})


@pytest.fixture(scope="module")
def http(server, tokens):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {tokens['owui']}"}) as c:
        yield c


@pytest.fixture(scope="module")
def served(server, tokens) -> str:
    return oai(server, tokens["owui"]).models.list().data[0].id


def finished(http) -> dict[str, int]:
    return {lane: state["finished"] for lane, state in lanes(http).items()}


def ran_on(http, before: dict[str, int], lane: str) -> bool:
    """One more request finished on `lane` since `before`, and on no other."""
    after = finished(http)
    return {k: after[k] - before[k] for k in after} == {k: int(k == lane) for k in after}


# ---- listed under lane names ----------------------------------------------------------------------


def test_openai_and_ollama_list_the_lanes_the_member_may_use(server, tokens, served):
    ids = [m.id for m in oai(server, tokens["owui"]).models.list().data]
    assert f"{served}:summaries" in ids and f"{served}:chat" in ids and f"{served}:indexing" in ids
    assert f"{served}:voice" not in ids  # not one of owui's lanes
    assert f"{served}:embeddings" not in ids  # the embeddings routes' own lane already
    assert [m.id for m in oai(server, tokens["kid"]).models.list().data if ":" in m.id] == [f"{served}:chat"]
    names = [m.model for m in olla(server, tokens["owui"]).list().models]
    assert f"{served}:latest" in names and f"{served}:summaries" in names


def test_ollama_shows_a_lane_name_as_the_served_model(server, tokens, served):
    shown = olla(server, tokens["owui"]).show(f"{served}:summaries")
    assert "completion" in shown.capabilities


# ---- a request naming a lane runs on it ------------------------------------------------------------


def test_openai_chat_named_summaries_runs_on_summaries(server, tokens, served, http):
    client = oai(server, tokens["owui"])
    before = finished(http)
    chat = client.chat.completions.create(model=f"{served}:summaries", messages=HI, max_tokens=4)
    assert chat.choices[0].message.content is not None
    assert ran_on(http, before, "summaries")
    before = finished(http)
    stream = client.chat.completions.create(model=f"{served}:summaries", messages=HI, max_tokens=4, stream=True)
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] in ("stop", "length")
    assert ran_on(http, before, "summaries")


def test_ollama_chat_and_generate_named_summaries_run_on_summaries(server, tokens, served, http):
    client = olla(server, tokens["owui"])
    before = finished(http)
    parts = list(client.chat(model=f"{served}:summaries", messages=HI, options=SHORT, stream=True))
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert ran_on(http, before, "summaries")
    before = finished(http)
    assert client.generate(model=f"{served}:summaries", prompt="Once upon a time", options=SHORT).done
    assert ran_on(http, before, "summaries")


def test_latest_and_the_bare_name_stay_on_the_chat_lane(server, tokens, served, http):
    before = finished(http)
    olla(server, tokens["owui"]).chat(model=f"{served}:latest", messages=HI, options=SHORT)
    assert ran_on(http, before, "chat")
    before = finished(http)
    oai(server, tokens["owui"]).chat.completions.create(model=served, messages=HI, max_tokens=4)
    assert ran_on(http, before, "chat")


@pytest.mark.parametrize("path, name", [("/v1/chat/completions", "openai_title.json"),
                                        ("/api/chat", "ollama_tags.json")])
def test_open_webuis_recorded_tasks_sent_with_the_summaries_name_run_on_summaries(http, served, path, name):
    """Open WebUI's Task model set to `<id>:summaries`: its task requests name it."""
    task = json.loads((FIXTURES / name).read_bytes())
    task["model"] = f"{served}:summaries"
    before = finished(http)
    r = http.post(path, json=task)
    assert r.status_code == 200, r.text
    assert ran_on(http, before, "summaries")


def test_the_name_wins_over_the_lane_header_and_conflicts_with_a_body_lane(server, tokens, served, http):
    before = finished(http)
    client = oai(server, tokens["owui"], **{"X-HomeAI-Lane": "chat"})
    client.chat.completions.create(model=f"{served}:summaries", messages=HI, max_tokens=4)
    assert ran_on(http, before, "summaries")
    r = http.post("/v1/chat/completions", json={"model": f"{served}:summaries", "lane": "chat", "messages": HI})
    assert r.status_code == 400 and r.json()["error"]["code"] == "lane_conflict", r.text


# ---- refused ---------------------------------------------------------------------------------------


def test_a_lane_the_member_may_not_use_is_refused_as_with_the_header(server, tokens, served):
    with pytest.raises(openai.PermissionDeniedError) as refused:
        oai(server, tokens["kid"]).chat.completions.create(model=f"{served}:summaries", messages=HI, max_tokens=4)
    assert refused.value.body["code"] == "lane_not_allowed" and "may not use lane 'summaries'" in refused.value.message
    with pytest.raises(ollama.ResponseError) as refused:
        olla(server, tokens["kid"]).chat(model=f"{served}:summaries", messages=HI, options=SHORT)
    assert refused.value.status_code == 403
    with pytest.raises(openai.PermissionDeniedError):  # a proxy's users have its lanes, no more
        oai(server, tokens["owui"], **{USER_HEADER: ALICE}).chat.completions.create(
            model=f"{served}:voice", messages=HI, max_tokens=4)


def test_a_name_whose_lane_is_no_lane_is_a_404(server, tokens, served):
    with pytest.raises(openai.NotFoundError) as refused:
        oai(server, tokens["owui"]).chat.completions.create(model=f"{served}:nowhere", messages=HI, max_tokens=4)
    assert f"{served}:<lane>" in refused.value.message
    with pytest.raises(ollama.ResponseError) as refused:
        olla(server, tokens["owui"]).chat(model=f"{served}:nowhere", messages=HI, options=SHORT)
    assert refused.value.status_code == 404


# ---- a proxy's users share fairly -------------------------------------------------------------------


def keys(server, lane: str) -> set[str]:
    """The fair-share keys the engine has finished generations for on `lane`."""
    return set(server.app.state.service.state().lanes[lane].member_prompt_cache)


def test_a_proxys_users_are_two_fair_share_keys(server, tokens, served):
    for user in (ALICE, BOB):
        oai(server, tokens["owui"], **{USER_HEADER: user}).chat.completions.create(
            model=f"{served}:summaries", messages=HI, max_tokens=4)
        olla(server, tokens["owui"], **{USER_HEADER: user}).chat(model=served, messages=HI, options=SHORT)
    assert {f"owui/{ALICE}", f"owui/{BOB}"} <= keys(server, "summaries")
    assert {f"owui/{ALICE}", f"owui/{BOB}"} <= keys(server, "chat")


def test_another_members_header_is_ignored(server, tokens, served):
    oai(server, tokens["bob"], **{USER_HEADER: "mallory"}).chat.completions.create(
        model=f"{served}:summaries", messages=HI, max_tokens=4)
    assert "bob" in keys(server, "summaries")
    assert not any(key.startswith("bob/") for key in keys(server, "summaries"))


def test_a_proxys_bad_user_is_a_400_naming_the_header(server, tokens, served):
    for bad in ("x" * 65, "alice smith"):
        with pytest.raises(openai.BadRequestError) as refused:
            oai(server, tokens["owui"], **{USER_HEADER: bad}).chat.completions.create(
                model=served, messages=HI, max_tokens=4)
        assert refused.value.body["code"] == "invalid_proxy_user" and USER_HEADER in refused.value.message
        assert bad not in refused.value.message
    with pytest.raises(ollama.ResponseError) as refused:
        olla(server, tokens["owui"], **{USER_HEADER: "x" * 65}).chat(model=served, messages=HI, options=SHORT)
    assert refused.value.status_code == 400 and USER_HEADER in refused.value.error
