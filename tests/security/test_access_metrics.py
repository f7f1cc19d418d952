"""With auth required, `/metrics` (lane counts, queue depths) is for members only, and a page of
another site cannot write even with a member's token in hand. A real server, auth on.

Run: .venv/bin/python -m pytest tests/security/test_access_metrics.py
"""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import TIMEOUT, add_token

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def anonymous(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:
        yield client


def test_metrics_need_a_member_token(anonymous):
    r = anonymous.get("/metrics")
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_token"
    r = anonymous.get("/metrics", headers={"Authorization": "Bearer hai_not-a-member"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert "homeai_queue_depth" not in r.text


def test_any_member_may_scrape(cfg, anonymous):
    token = add_token(cfg, "prometheus")  # no admin needed: a member made for the scraper
    r = anonymous.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and "homeai_model_loaded" in r.text


def test_a_cross_site_write_is_refused_with_auth_on_too(http):
    r = http.post("/api/conversations", headers={"Origin": "http://evil.example"}, json={"title": "x"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"
    assert http.post("/api/conversations", json={"title": "x"}).status_code == 201  # the same, from no page
