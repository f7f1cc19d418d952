"""Images in the household page (issue 53), in a real Chromium against a server whose model reads
images (`vision_runner`: a projector of random weights, so the answers are noise): attach a picture
or paste one, see it as a chip and remove it, send it with a question, see it in the conversation,
and again after a reload; a file that is not an image, or too large, is refused in the page.

Run: .venv/bin/python -m pytest tests/web/test_images_ui.py
"""

from __future__ import annotations

import base64
import json
import re

import pytest
from playwright.sync_api import expect

from tests.api.conftest import serve
from tests.api.test_vision import png
from tests.web.conftest import PHONE, screenshot
from tests.web.test_chat_ui import send, wait_answer_done

pytestmark = [pytest.mark.model, pytest.mark.browser]
pytest.importorskip("gguf")

QUESTION = "Who is at the door?"
PASTE = """([b64, name]) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], name, {type: "image/png"}));
    const input = document.getElementById("message-input");
    input.focus();
    input.dispatchEvent(new ClipboardEvent("paste", {clipboardData: data, bubbles: true, cancelable: true}));
}"""


@pytest.fixture(scope="module")
def server(cfg, vision_runner):
    with serve(cfg, vision_runner) as running:
        yield running


def short_answers(page) -> None:
    """Short answers on every send from this page: noise from a random projector needs no more."""
    def route(r):
        body = {**json.loads(r.request.post_data), "max_tokens": 8, "temperature": 0}
        r.continue_(post_data=json.dumps(body))
    page.route(re.compile(r"/api/conversations/\d+/(messages|regenerate)$"), route)


def stored_images(page, api) -> list[list[bytes]]:
    """Each stored message's images, as the server serves them."""
    cid = int(re.search(r"#c/(\d+)$", page.url).group(1))
    messages = api.get(f"/api/conversations/{cid}").json()["messages"]
    return [[api.get(i["url"]).content for i in m["images"]] for m in messages]


def test_attach_a_picture_ask_and_find_it_after_a_reload(new_page, api, tmp_path):
    picture = tmp_path / "porch.png"
    picture.write_bytes(png(4, size=(48, 32)))
    page = new_page()
    page.goto("/")
    short_answers(page)
    expect(page.get_by_test_id("new-chat")).to_be_visible()
    page.get_by_test_id("attach-input").set_input_files(str(picture))
    expect(page.get_by_test_id("attachment")).to_have_count(1)
    send(page, QUESTION)
    expect(page.get_by_test_id("attachment")).to_have_count(0)
    wait_answer_done(page)
    question = page.locator(".message.user")
    expect(question).to_have_count(1)
    expect(question.get_by_test_id("message-image")).to_have_count(1)
    assert stored_images(page, api)[0] == [picture.read_bytes()]

    page.reload()
    shown = page.locator(".message.user").get_by_test_id("message-image")
    expect(shown).to_have_attribute("src", re.compile(r"^data:image/png;base64,"))
    expect(shown).to_have_js_property("naturalWidth", 48)
    screenshot(page, "images-after-reload")
    assert not page.errors and not page.dialogs


def test_paste_a_picture_remove_one_and_send_the_other(new_page, api, tmp_path):
    attached = tmp_path / "garden.png"
    attached.write_bytes(png(6))
    page = new_page()
    page.goto("/")
    short_answers(page)
    expect(page.get_by_test_id("new-chat")).to_be_visible()
    page.evaluate(PASTE, [base64.b64encode(png(5)).decode(), "pasted.png"])
    expect(page.get_by_test_id("attachment")).to_have_count(1)
    page.get_by_test_id("attach-input").set_input_files(str(attached))
    expect(page.get_by_test_id("attachment")).to_have_count(2)
    screenshot(page, "images-chips")
    page.get_by_role("button", name="Remove pasted.png").click()
    expect(page.get_by_test_id("attachment")).to_have_count(1)
    send(page, QUESTION)
    wait_answer_done(page)
    expect(page.locator(".message.user").get_by_test_id("message-image")).to_have_count(1)
    assert stored_images(page, api)[0] == [attached.read_bytes()]
    assert not page.errors


def test_a_file_that_is_not_an_image_or_too_large_is_refused_in_the_page(new_page):
    page = new_page()
    page.goto("/")
    expect(page.get_by_test_id("new-chat")).to_be_visible()
    attach = page.get_by_test_id("attach-input")
    attach.set_input_files({"name": "notes.txt", "mimeType": "text/plain", "buffer": b"milk, eggs"})
    expect(page.locator("#notice")).to_contain_text("notes.txt is not an image")
    attach.set_input_files({"name": "huge.png", "mimeType": "image/png", "buffer": png(7)[:8] + bytes(3_000_000)})
    expect(page.locator("#notice")).to_contain_text("huge.png is too large")
    expect(page.get_by_test_id("attachment")).to_have_count(0)
    page.get_by_test_id("message-input").fill("")
    page.evaluate(PASTE, [base64.b64encode(png(8)).decode(), "pasted.png"])
    expect(page.get_by_test_id("attachment")).to_have_count(1)
    page.get_by_test_id("message-input").press("Enter")  # an image with no words: not sent
    expect(page.locator("#notice")).to_contain_text("Ask something about the image")
    expect(page.locator(".message")).to_have_count(0)
    assert not page.errors


def test_four_chips_fit_a_phone(new_page, tmp_path):
    page = new_page(viewport=PHONE, mobile=True)
    page.goto("/")
    expect(page.get_by_test_id("message-input")).to_be_visible()
    files = []
    for i in range(4):
        files.append(tmp_path / f"photo{i}.png")
        files[-1].write_bytes(png(10 + i))
    page.get_by_test_id("attach-input").set_input_files([str(f) for f in files])
    expect(page.get_by_test_id("attachment")).to_have_count(4)
    page.get_by_test_id("attach-input").set_input_files(str(files[0]))
    expect(page.locator("#notice")).to_contain_text("At most 4 images")
    expect(page.get_by_test_id("attachment")).to_have_count(4)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], "the page scrolls sideways"
    expect(page.get_by_test_id("send-button")).to_be_in_viewport()
    screenshot(page, "images-phone")
