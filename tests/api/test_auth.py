"""Auth required: bearer tokens name household members, who are the fair-share key.

Run: .venv/bin/python -m pytest tests/api/test_auth.py
"""

from __future__ import annotations

import openai
import pytest

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import revoke
from homeai.store.stats import recent_requests
from tests.api.conftest import TIMEOUT, add_token, api_config, wait_for

pytestmark = pytest.mark.model

KITCHEN = "http://kitchen.local:3000"
HI = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, server={"cors_origins": [KITCHEN]})


@pytest.fixture(scope="module")
def store(cfg, server):
    engine = make_engine(cfg.database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("path", ["/v1/models", "/api/lanes"])
def test_no_token_is_401(http, path):
    r = http.get(path)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_token"
    assert r.headers["WWW-Authenticate"] == "Bearer"


def test_no_token_on_a_post_is_401(http):
    assert http.post("/v1/chat/completions", json=HI).status_code == 401


@pytest.mark.parametrize("header", ["Bearer hai_wrong", "Bearer", "Basic dXNlcjpwYXNz", "hai_no_scheme",
                                    "Bearer not-even-hai"])
def test_bad_token_is_401(http, header):
    r = http.get("/v1/models", headers={"Authorization": header})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_health_needs_no_token_and_metrics_any_members(cfg, http):
    assert http.get("/healthz").status_code == 200
    assert http.get("/metrics").status_code == 401  # unless server.metrics_public (tests/security/test_access_metrics.py)
    assert http.get("/metrics", headers=bearer(add_token(cfg, "prometheus"))).status_code == 200


def test_member_token_works_and_names_the_member(cfg, server, http, store):
    token = add_token(cfg, "bob")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0)
    assert client.models.list().data
    reply = client.chat.completions.create(model="homeai", **HI)
    assert reply.choices[0].message.content is not None
    assert http.get("/api/lanes", headers=bearer(token)).status_code == 200

    def bobs():
        with store() as session:
            return [s for s in recent_requests(session, lane="chat") if s.member == "bob"]
    rows = wait_for(bobs)  # written in batches by the stats thread
    assert rows and rows[0].outcome in ("stop", "length") and rows[0].prompt_tokens > 0


def test_revoked_token_is_401(cfg, http, store):
    token = add_token(cfg, "carol")
    assert http.get("/v1/models", headers=bearer(token)).status_code == 200
    with store() as session:
        assert revoke(session, name="carol") == 1
    assert http.get("/v1/models", headers=bearer(token)).status_code == 401


def test_cors_allows_only_the_configured_origins(http):
    def preflight(origin):
        return http.options("/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})

    allowed = preflight(KITCHEN)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == KITCHEN
    assert "access-control-allow-origin" not in preflight("http://evil.example").headers
