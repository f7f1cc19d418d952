"""The household web UI in a real, headless Chromium against a real server: sign in, send and
watch the answer stream, stop it (and see the server abort the sequence), regenerate, reload
and find the conversation, rename and delete, model output rendered inert, the box view,
and the phone layout. Screenshots land in test-artifacts/web/.

Run: .venv/bin/python -m pytest tests/web
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect
from sqlalchemy import select

from homeai.store.conversations import add_message
from homeai.store.models import Member
from tests.api.conftest import wait_for
from tests.web.conftest import PHONE, screenshot

pytestmark = [pytest.mark.model, pytest.mark.browser]

ANSWER_MS = 180_000  # generous: the box is shared; no test asserts on time
COUNTING = "Count from 1 to 1000, one number per line."
XSS_REPLY = """Here is some **bold** advice and a list:

- first <img src=x onerror="window.__xss = 'img'; alert('img')">
- second <script>window.__xss = 'script'; alert('script')</script>

```html
<script>window.__xss = 'code'</script>
```

[a safe link](https://example.org/a_b) and [a bad one](javascript:alert(1)) and <a href="javascript:alert(2)">raw</a>
<iframe src="javascript:alert(3)"></iframe><svg onload="alert(4)"></svg>"""


JOBS = {"jobs": [
    {"name": "index", "description": "Index the household's documents", "schedule": "every 6h", "running": True,
     "last_run": {"status": "running", "items_done": 3, "items_total": 10, "current_item": "/home/family/recipes.pdf"}},
    {"name": "summarise", "description": "Summarise new documents", "schedule": None, "running": False,
     "last_run": {"status": "done", "items_done": 4, "items_total": 4, "current_item": None}},
], "documents": {"indexed": 12, "skipped": 1, "summarised": 4, "chunks": 80}}


def answers(page):
    return page.get_by_test_id("assistant-message")


def send(page, text: str) -> None:
    page.get_by_test_id("message-input").fill(text)
    page.get_by_test_id("message-input").press("Enter")


def wait_answer_done(page):
    last = answers(page).last
    expect(last).to_be_visible(timeout=ANSWER_MS)
    expect(last).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=ANSWER_MS)
    return last


def chat_running(api) -> int:
    return api.get("/api/lanes").json()["lanes"]["chat"]["running"]


def inject(store, title: str, messages: list[tuple[str, str]], api) -> int:
    """A conversation of the test member with messages written straight into the store."""
    cid = api.post("/api/conversations", json={"title": title}).json()["id"]
    with store() as session:
        member_id = session.scalar(select(Member.id).where(Member.name == "web"))
        for role, content in messages:
            add_message(session, member_id=member_id, conversation_id=cid, role=role, content=content)
    return cid


def long_answers(page) -> None:
    """Ask the server for a long answer on every send from this page (the lane's cap is 512)."""
    def route(r):
        body = {**json.loads(r.request.post_data), "max_tokens": 3000, "temperature": 0}
        r.continue_(post_data=json.dumps(body))
    page.route(re.compile(r"/api/conversations/\d+/(messages|regenerate)$"), route)


def test_sign_in_with_a_member_token(new_page, token):
    page = new_page(signed_in=False)
    page.goto("/")
    expect(page.get_by_label("Member token")).to_be_focused()
    screenshot(page, "signin")
    page.get_by_label("Member token").fill("hai_not_a_real_token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("That token was not accepted.")
    page.get_by_label("Member token").fill(token)
    page.get_by_label("Member token").press("Enter")
    expect(page.get_by_test_id("conversation-list")).to_be_visible()
    expect(page.get_by_test_id("message-input")).to_be_focused()
    assert page.evaluate("localStorage.getItem('homeai.token')") == token
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("Member token")).to_be_visible()


def test_send_see_the_streamed_answer_and_find_it_after_reload(new_page, api):
    page = new_page()
    page.goto("/")
    expect(page.get_by_test_id("new-chat")).to_be_visible()
    page.evaluate("""() => {
        window.__paints = 0;  // how many times an answer's text changed while it streamed
        new MutationObserver((records) => {
            if (records.some((r) => r.target.closest && r.target.closest('.message.streaming'))) window.__paints += 1;
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")
    send(page, "Say hello to the family in one sentence.")
    expect(page.get_by_test_id("stop-button")).to_be_visible()
    expect(page.locator(".message.user")).to_have_text(re.compile("Say hello to the family"))
    answer = wait_answer_done(page)
    expect(page.get_by_test_id("send-button")).to_be_visible()
    text = answer.locator(".bubble").inner_text()
    assert text.strip()
    assert page.evaluate("window.__paints") >= 2, "the answer arrived in one piece, not streamed"

    cid = int(re.search(r"#c/(\d+)$", page.url).group(1))
    stored = api.get(f"/api/conversations/{cid}").json()
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"]
    assert stored["title"] == "Say hello to the family in one sentence."
    screenshot(page, "desktop-chat")

    page.goto("/")  # a fresh load: the conversation is listed, and opens with its history
    listed = page.get_by_test_id("conversation-list").get_by_role("button", name="Say hello to the family")
    expect(listed).to_have_count(1)
    listed.click()
    expect(answers(page)).to_have_count(1)
    expect(page.locator(".message.user")).to_have_count(1)
    expect(page.locator("#chat-title")).to_have_text("Say hello to the family in one sentence.")
    page.reload()  # the address keeps the open conversation
    expect(answers(page)).to_have_count(1)
    assert not page.errors and not page.dialogs


def test_stop_mid_answer_aborts_generation_on_the_server(new_page, api):
    page = new_page()
    long_answers(page)
    page.goto("/")
    expect(page.get_by_test_id("new-chat")).to_be_visible()
    send(page, COUNTING)
    answer = answers(page).last
    expect(answer.locator(".bubble")).to_have_text(re.compile(r"\S{6,}|\S+\s+\S+\s+\S+"), timeout=ANSWER_MS)
    assert chat_running(api) == 1
    screenshot(page, "desktop-streaming")
    page.get_by_test_id("stop-button").click()
    expect(answer.locator(".message-note")).to_have_text("Stopped.", timeout=ANSWER_MS)
    assert wait_for(lambda: chat_running(api) == 0)
    assert api.get("/api/lanes").json()["kv"]["seqs_used"] == 0
    expect(page.get_by_test_id("send-button")).to_be_visible()
    expect(page.get_by_test_id("stop-button")).to_be_hidden()

    cid = int(re.search(r"#c/(\d+)$", page.url).group(1))
    messages = api.get(f"/api/conversations/{cid}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert 0 < messages[1]["output_tokens"] < 3000  # stopped, not finished

    # regenerate the stopped answer, and stop that one with Esc
    page.get_by_role("button", name="Regenerate").click()
    expect(page.get_by_test_id("stop-button")).to_be_visible()
    expect(answers(page).filter(visible=True)).to_have_count(1)  # the old answer makes way for the new one
    expect(answers(page).last.locator(".bubble")).not_to_be_empty(timeout=ANSWER_MS)
    assert wait_for(lambda: chat_running(api) == 1)
    page.keyboard.press("Escape")
    expect(answers(page).last.locator(".message-note")).to_have_text("Stopped.", timeout=ANSWER_MS)
    assert wait_for(lambda: chat_running(api) == 0)
    messages = api.get(f"/api/conversations/{cid}").json()["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    expect(answers(page)).to_have_count(1)
    assert not page.errors and not page.dialogs


def test_html_in_a_reply_renders_inert(new_page, api, store):
    cid = inject(store, "Markup", [("user", "Show me some HTML"), ("assistant", XSS_REPLY)], api)
    page = new_page()
    page.goto(f"/#c/{cid}")
    answer = answers(page).last
    expect(answer).to_contain_text("<img src=x onerror=")
    expect(answer).to_contain_text("<script>window.__xss = 'script'")
    page.wait_for_timeout(300)  # give any injected handler its chance to fire
    assert page.evaluate("window.__xss") is None
    assert page.evaluate("document.querySelectorAll('#messages img, #messages script, #messages iframe, "
                         "#messages svg, #messages [onerror], #messages [onload]').length") == 0
    hrefs = answer.locator("a").evaluate_all("links => links.map((a) => a.getAttribute('href'))")
    assert hrefs == ["https://example.org/a_b"]
    # and the Markdown around it still renders
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer.locator("li")).to_have_count(2)
    expect(answer.locator("pre code")).to_contain_text("<script>window.__xss = 'code'</script>")
    screenshot(page, "desktop-markup")
    page.emulate_media(color_scheme="dark")
    screenshot(page, "desktop-markup-dark")
    assert not page.errors and not page.dialogs


def test_rename_and_delete_from_the_ui(new_page, api, store):
    cid = inject(store, "Garden plans", [("user", "Tomatoes?"), ("assistant", "Yes, in **May**.")], api)
    page = new_page()
    page.goto("/")
    page.get_by_test_id("conversation-list").get_by_role("button", name="Garden plans").click()
    expect(answers(page).last.locator("strong")).to_have_text("May")

    page.get_by_role("button", name="Rename").click()
    title = page.get_by_label("Conversation title")
    expect(title).to_be_focused()
    title.fill("Vegetable garden")
    title.press("Enter")
    expect(page.get_by_test_id("conversation-list")).to_contain_text("Vegetable garden")
    assert api.get(f"/api/conversations/{cid}").json()["title"] == "Vegetable garden"

    page.get_by_role("button", name="Delete").click()
    page.get_by_role("button", name="Really delete?").click()
    expect(page.get_by_test_id("conversation-list")).not_to_contain_text("Vegetable garden")
    expect(page.locator("#chat-title")).to_have_text("New chat")
    assert api.get(f"/api/conversations/{cid}").status_code == 404

    page.get_by_test_id("new-chat").click()
    expect(page.get_by_test_id("message-input")).to_be_focused()


def test_the_box_view_shows_lanes_and_jobs(new_page):
    page = new_page()
    page.goto("/")
    page.get_by_role("button", name="Box", exact=True).click()
    lanes = page.locator("#box-lanes tr")
    expect(lanes.filter(has_text="chat")).to_have_count(1)
    expect(lanes.filter(has_text="voice")).to_have_count(1)
    expect(page.locator("#box-kv progress")).to_have_count(3)
    expect(page.locator("#box-kv")).to_contain_text("Cached prefix cells")
    expect(lanes.filter(has_text="chat").locator('td[data-label="Prompt cached"]')).to_have_text(re.compile(r"^(–|\d+%)$"))
    expect(page.locator("#box-jobs")).not_to_be_empty()  # whether or not this server runs jobs
    first = page.locator("#box-status").inner_text()
    expect(page.locator("#box-status")).not_to_have_text(first, timeout=10_000)  # it polls

    # a running job shows its progress on the next poll
    page.route("**/api/jobs", lambda r: r.fulfill(json=JOBS))
    job = page.locator("#box-jobs .job").filter(has_text="index")
    expect(job.locator("progress")).to_have_attribute("value", "3", timeout=10_000)
    expect(job.locator("progress")).to_have_attribute("max", "10")
    expect(job).to_contain_text("running · 3 / 10 items")
    expect(job).to_contain_text("/home/family/recipes.pdf")
    expect(page.locator("#box-jobs")).to_contain_text("12 indexed")
    screenshot(page, "desktop-box")
    page.get_by_role("button", name="Chat", exact=True).click()
    expect(page.get_by_test_id("message-input")).to_be_visible()
    assert not page.errors


def test_the_phone_layout(new_page, api, store):
    cid = inject(store, "Phone chat", [("user", "A recipe?"),
                                       ("assistant", "1. Boil **water**\n2. Add `pasta`\n\n```\nsalt = 10  # grams\n```")],
                 api)
    page = new_page(viewport=PHONE, mobile=True)
    page.goto(f"/#c/{cid}")
    expect(answers(page)).to_have_count(1)
    expect(page.get_by_test_id("conversation-list")).to_be_hidden()  # the list is a drawer here
    expect(page.get_by_test_id("message-input")).to_be_visible()
    expect(page.get_by_test_id("send-button")).to_be_visible()
    screenshot(page, "phone-chat")
    page.get_by_role("button", name="Conversations").click()
    expect(page.get_by_test_id("conversation-list")).to_be_visible()
    screenshot(page, "phone-drawer")
    page.get_by_test_id("conversation-list").get_by_role("button", name="Phone chat").click()
    expect(page.get_by_test_id("conversation-list")).to_be_hidden()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], "the page scrolls sideways on a phone"
    page.get_by_role("button", name="Box", exact=True).click()
    expect(page.locator("#box-lanes tr")).to_have_count(5)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]  # the table scrolls, not the page
    screenshot(page, "phone-box")
    assert not page.errors
