"""The household page's Box tab shows an admin who is using the box (issue 54): each member and
each user behind a trusted proxy, with their counts; a member who is not an admin sees no one else.
Real Chromium against a real server (tests/web/conftest.py), here with an admin's token.

Run: .venv/bin/python -m pytest -q tests/web/test_box_members_ui.py
"""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.members import add_member
from tests.api.conftest import TIMEOUT, add_token
from tests.web.conftest import PHONE, screenshot

pytestmark = [pytest.mark.model, pytest.mark.browser]

USER_HEADER = "X-OpenWebUI-User-Id"


@pytest.fixture(scope="module")
def token(cfg, server):
    """The page's member: an admin here."""
    return add_token(cfg, "ma", admin=True)


@pytest.fixture(scope="module")
def proxy_users(cfg, server):
    """Two Open WebUI users asked through a trusted proxy member; their names as the page shows them."""
    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as s:
            proxy = add_member(s, name="owui", proxy=True)[1]
    finally:
        engine.dispose()
    for user in ("alice", "bob"):
        headers = {"Authorization": f"Bearer {proxy}", USER_HEADER: user}
        with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=headers) as http:
            r = http.post("/v1/chat/completions", json={"model": "homeai", "max_tokens": 3,
                                                        "messages": [{"role": "user", "content": "Hi"}]})
            assert r.status_code == 200, r.text
    return ["owui › alice", "owui › bob"]


def test_an_admin_sees_who_is_using_the_box(new_page, proxy_users):
    page = new_page()
    page.goto("/")
    page.get_by_role("button", name="Box", exact=True).click()
    expect(page.get_by_role("heading", name="Who is using the box")).to_be_visible()
    rows = page.locator("#box-members tr")
    for name in proxy_users:
        row = rows.filter(has=page.get_by_role("rowheader", name=name, exact=True))
        expect(row).to_have_count(1)
        expect(row.locator("td").nth(4)).to_have_text("3")  # its answer's tokens this hour
    expect(page.get_by_role("columnheader", name="Cells cached")).to_be_visible()
    screenshot(page, "desktop-box-members")
    assert not page.errors


def test_the_rows_read_on_a_phone(new_page, proxy_users):
    page = new_page(viewport=PHONE, mobile=True)
    page.goto("/")
    page.get_by_role("button", name="Box", exact=True).click()
    expect(page.locator("#box-members tr").filter(has_text="owui › alice")).to_have_count(1)
    screenshot(page, "phone-box-members")
    assert not page.errors


def test_a_member_who_is_not_an_admin_sees_no_one_else(new_page, cfg, proxy_users):
    page = new_page(signed_in=False)
    page.add_init_script(f"localStorage.setItem('homeai.token', {add_token(cfg, 'kid')!r})")
    page.goto("/")
    page.get_by_role("button", name="Box", exact=True).click()
    expect(page.locator("#box-lanes tr").filter(has_text="chat")).to_have_count(1)  # the box view as before
    expect(page.get_by_role("heading", name="Who is using the box")).to_have_count(0)
    expect(page.locator("#box-members")).to_have_count(0)
    assert not page.errors
