"""Drafted tokens as a household sees them (`[speculative]`, on by default): an answer through the
`openai` client is the same with guesses checked, and `/api/lanes` and `/metrics` show what was drafted
and accepted: a member sees their own figures, an admin every lane's (how much an answer echoed its
prompt says something of the prompt)."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import TIMEOUT, add_token, api_config, serve

DEVICES = "light.kitchen_ceiling, light.hallway_main, cover.garage_door_left, climate.living_room_thermostat"
ECHO = [{"role": "user", "content": f"These are the devices: {DEVICES}. Repeat every device name above, one per line."}]


@pytest.fixture(scope="module")
def tokens(cfg):
    return {name: add_token(cfg, name, admin=name == "root") for name in ("alice", "bob", "root")}


def get(server, token: str, path: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)


def drafting(server, token: str) -> dict:
    return get(server, token, "/api/lanes").json()["lanes"]["chat"]["drafting"]


def test_an_echoing_answer_is_drafted_and_each_member_sees_their_own_figures(server, tokens):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=tokens["alice"], timeout=TIMEOUT, max_retries=0) as alice:
        reply = alice.chat.completions.create(model="homeai", messages=ECHO, temperature=0, max_tokens=40)
    assert "light.kitchen_ceiling" in reply.choices[0].message.content
    assert reply.usage.completion_tokens == 40 or reply.choices[0].finish_reason == "stop"
    mine, bobs, admins = drafting(server, tokens["alice"]), drafting(server, tokens["bob"]), drafting(server, tokens["root"])
    assert mine["drafted"] >= mine["accepted"] > 0 and 0 < mine["acceptance"] <= 1
    assert bobs == {"drafted": 0, "accepted": 0, "length": 0, "acceptance": 0.0}, "bob sees none of alice's"
    assert admins["accepted"] >= mine["accepted"]
    assert drafting(server, tokens["root"])["drafted"] == admins["drafted"]


def test_metrics_show_drafting_to_an_admin_only(server, tokens):
    families = {}
    for name in ("bob", "root"):
        r = get(server, tokens[name], "/metrics")
        assert r.status_code == 200
        families[name] = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert not any(name.startswith("homeai_draft") for name in families["bob"])
    drafted = {s.labels["lane"]: s.value for s in families["root"]["homeai_draft_tokens"].samples}
    accepted = {s.labels["lane"]: s.value for s in families["root"]["homeai_draft_accepted_tokens"].samples}
    assert drafted["chat"] >= accepted["chat"] > 0 and drafted["summaries"] == 0
    assert "homeai_draft_length" in families["root"]


def test_drafting_off_drafts_nothing(runner, module_tmp):
    cfg = api_config(module_tmp / "off", speculative={"enabled": False})
    (module_tmp / "off").mkdir(exist_ok=True)
    with serve(cfg, runner) as server:
        token = add_token(cfg, "carol")
        with openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0) as carol:
            carol.chat.completions.create(model="homeai", messages=ECHO, temperature=0, max_tokens=24)
        assert drafting(server, token) == {"drafted": 0, "accepted": 0, "length": 0, "acceptance": 0.0}
