"""The web UI on a server without auth (loopback only): no sign-in, the household's own
conversations at once; and the phone drawer driven by keyboard alone.

Run: .venv/bin/python -m pytest tests/web/test_open_ui.py
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.api.conftest import api_config
from tests.web.conftest import PHONE

pytestmark = [pytest.mark.model, pytest.mark.browser]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return api_config(tmp_path_factory.mktemp("web-open"), auth={"required": False})


def test_no_sign_in_when_auth_is_off(new_page, server):
    page = new_page(signed_in=False)
    page.goto("/")
    expect(page.get_by_test_id("message-input")).to_be_visible()
    expect(page.get_by_label("Member token")).to_be_hidden()
    expect(page.get_by_role("button", name="Sign out")).to_be_hidden()
    expect(page.get_by_test_id("conversation-list")).to_contain_text("No conversations yet.")
    assert not page.errors


def test_the_phone_drawer_by_keyboard(new_page, server):
    page = new_page(signed_in=False, viewport=PHONE, mobile=True)
    page.goto("/")
    menu = page.get_by_role("button", name="Conversations")
    menu.focus()
    page.keyboard.press("Enter")
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_test_id("new-chat")).to_be_focused()  # focus moves into the drawer
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("conversation-list")).to_be_hidden()
    expect(menu).to_be_focused()  # and back to where it came from
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")  # "+ New chat" closes the drawer and lands in the message box
    expect(page.get_by_test_id("message-input")).to_be_focused()
    assert not page.errors
