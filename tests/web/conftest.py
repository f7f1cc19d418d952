"""A real Chromium (Debian's, driven by Playwright) against a real homeai server with auth on.

The server runs over the session's one loaded model (the shared `runner` fixture); each test
gets a fresh browser context whose localStorage already holds a member's token. Screenshots
go to `test-artifacts/web/` (gitignored) for a person to look at.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from homeai.store.db import make_engine, make_sessionmaker
from tests.api.conftest import TIMEOUT, add_token, api_config, server  # noqa: F401 (fixture: the daemon over `cfg`)

CHROMIUM = os.environ.get("HOMEAI_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return api_config(tmp_path_factory.mktemp("web"), auth={"required": True})


@pytest.fixture(scope="module")
def token(cfg, server):
    return add_token(cfg, "web")


@pytest.fixture(scope="module")
def api(server, token):
    """The member's own HTTP client, to check what the server did."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"}) as c:
        yield c


@pytest.fixture(scope="module")
def store(cfg, server):
    engine = make_engine(cfg.database_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="package")
def playwright():
    """One Playwright for the browser tests. Its sync API keeps an event loop running in the main
    thread while it lives, so it ends with this package: async tests after it (tests/wyoming)
    could not start their own loop otherwise."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set HOMEAI_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


def launch(playwright, *extra_args: str):
    """Debian's Chromium, headless."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", *extra_args])


@pytest.fixture(scope="package")
def browser(playwright):
    launched = launch(playwright)
    yield launched
    launched.close()


@pytest.fixture
def new_page(browser, server, token):
    """Pages in fresh contexts: `new_page(signed_in=True, viewport=DESKTOP)`; each records
    page errors and dialogs (an `alert` from model output would be one)."""
    contexts = []

    def make(*, signed_in: bool = True, viewport: dict = DESKTOP, mobile: bool = False):
        context = browser.new_context(base_url=server.url, viewport=viewport, is_mobile=mobile, has_touch=mobile)
        context.set_default_timeout(30_000)
        if signed_in:
            context.add_init_script(f"localStorage.setItem('homeai.token', {token!r})")
        contexts.append(context)
        page = context.new_page()
        page.errors, page.dialogs = [], []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
        return page

    yield make
    for context in contexts:
        context.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), animations="disabled")  # a drawer caught mid-slide shows nothing
    return path
