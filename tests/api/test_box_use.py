"""Who is using the box, and the served model's short alias (issue 54), on a real server with auth.

* `/api/lanes` lists, for an admin only, each member and each user a trusted proxy names
  (`owui/<user>`): requests running and waiting, the last hour's tokens, cells held and cached;
  counts, never text. Another member's view is what it was (no `members`).
* `[clients] model_alias = "home"`: `home` and `home:<lane>` are listed beside the file's names in
  `/v1/models` (and as `home:latest`, `home:<lane>` in `/api/tags`) and taken as model names; a
  lane name picks its lane as `<id>:<lane>` does.

Run: .venv/bin/python -m pytest -q tests/api/test_box_use.py
"""

from __future__ import annotations

import threading

import httpx
import pytest

from homeai.engine.usage import HourlyTokens
from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.api.conftest import TIMEOUT, api_config, lanes, wait_for

pytestmark = pytest.mark.model

USER_HEADER = "X-OpenWebUI-User-Id"
HI = [{"role": "user", "content": "Hi"}]
SECRET = "my locker code is 4471"
ROW_KEYS = {"key", "member", "user", "running", "waiting", "tokens_hour", "cells_used", "cells_cached"}


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, clients={"model_alias": "home"})


@pytest.fixture(scope="module")
def tokens(cfg, server) -> dict[str, str]:
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as s:
            return {"admin": add_member(s, name="ma", admin=True)[1], "owui": add_member(s, name="owui", proxy=True)[1],
                    "bob": add_member(s, name="bob")[1]}
    finally:
        engine.dispose()


def client(server, token: str, user: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}", **({USER_HEADER: user} if user else {})}
    return httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=headers)


def ask(http: httpx.Client, model: str = "home", **body) -> dict:
    r = http.post("/v1/chat/completions", json={"model": model, "messages": HI, "max_tokens": 4, **body})
    assert r.status_code == 200, r.text
    return r.json()


def rows(server, token: str) -> dict[str, dict]:
    with client(server, token) as http:
        return {row["key"]: row for row in http.get("/api/lanes").json()["members"]}


def test_an_admin_sees_each_member_and_each_proxy_user(server, tokens):
    for user in ("alice", "carol"):
        with client(server, tokens["owui"], user) as http:
            ask(http, messages=[{"role": "user", "content": SECRET}])
    with client(server, tokens["bob"]) as http:
        ask(http)
    seen = rows(server, tokens["admin"])
    assert {"owui/alice", "owui/carol", "bob"} <= set(seen)
    alice = seen["owui/alice"]
    assert set(alice) == ROW_KEYS and (alice["member"], alice["user"]) == ("owui", "alice")
    assert seen["bob"]["user"] is None
    assert alice["tokens_hour"]["prompt"] > 0 and alice["tokens_hour"]["output"] == 4
    assert alice["running"] == alice["waiting"] == 0
    assert alice["cells_cached"] > 0  # its finished chat's prefix is kept for its next turn
    with client(server, tokens["admin"]) as http:
        assert SECRET not in http.get("/api/lanes").text and "4471" not in http.get("/api/lanes").text


def test_a_running_request_is_shown_as_running(server, tokens):
    def long_answer():  # counting on, greedy: it runs to its max_tokens
        with client(server, tokens["owui"], "dave") as http:
            ask(http, max_tokens=300, temperature=0,
                messages=[{"role": "user", "content": "Count from 1 to 500, one number a line."}])

    thread = threading.Thread(target=long_answer, daemon=True)
    thread.start()
    try:
        seen = wait_for(lambda: rows(server, tokens["admin"]).get("owui/dave", {}).get("running") == 1
                        and rows(server, tokens["admin"])["owui/dave"])
        assert seen and seen["running"] == 1 and seen["cells_used"] > 0 and seen["waiting"] == 0
    finally:
        thread.join(TIMEOUT)
    assert rows(server, tokens["admin"])["owui/dave"]["running"] == 0


def test_another_member_sees_no_one_else(server, tokens):
    with client(server, tokens["bob"]) as http:
        view = http.get("/api/lanes").json()
    assert "members" not in view and "chat" in view["lanes"]


def test_the_alias_is_listed_beside_the_files_names(server, tokens):
    with client(server, tokens["bob"]) as http:
        ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
        tags = [m["name"] for m in http.get("/api/tags").json()["models"]]
    served = ids[0]
    assert ids[ids.index("home"):] == ["home", "home:chat", "home:summaries", "home:indexing"]  # bob's lanes, after the file's names
    assert {f"{served}:chat", f"{served}:summaries"} <= set(ids[:ids.index("home")])
    assert {"home:latest", "home:chat", "home:summaries"} <= set(tags) and "home" not in tags


def test_the_alias_is_taken_as_a_model_name_and_its_lane_names_pick_lanes(server, tokens):
    with client(server, tokens["bob"]) as http:
        before = lanes(http)
        assert ask(http, "home")["model"]
        ask(http, "home:latest")
        ask(http, "home:summaries")
        after = lanes(http)
        assert after["chat"]["finished"] == before["chat"]["finished"] + 2
        assert after["summaries"]["finished"] == before["summaries"]["finished"] + 1
        r = http.post("/api/show", json={"model": "home:latest"})
        assert r.status_code == 200, r.text
        r = http.post("/v1/chat/completions", json={"model": "hom", "messages": HI, "max_tokens": 4})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_hourly_tokens_forget_what_is_over_an_hour_old():
    now = [0.0]
    hourly = HourlyTokens(clock=lambda: now[0])
    stats = type("Stats", (), {"member": "owui/alice", "prompt_tokens": 100, "cached_tokens": 60, "output_tokens": 7})
    hourly.observe(stats)
    now[0] = 1800.0
    hourly.observe(stats)
    assert hourly.totals() == {"owui/alice": {"prompt": 200, "cached": 120, "output": 14}}
    now[0] = 3601.0  # the first is over an hour old
    assert hourly.totals() == {"owui/alice": {"prompt": 100, "cached": 60, "output": 7}}
    now[0] = 5500.0
    assert hourly.totals() == {}
