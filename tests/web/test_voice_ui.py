"""Push-to-talk in a real Chromium: its fake microphone plays synthesised speech (espeak-ng,
sox), the page streams it as PCM16 16 kHz to `/v1/voice`, the transcript appears as the
member's message, the answer streams in and is stored, and read-aloud speaks it.

Run: .venv/bin/python -m pytest tests/web/test_voice_ui.py
"""

from __future__ import annotations

import re
import wave

import pytest
from playwright.sync_api import expect

from tests.api.conftest import wait_for
from tests.speech.conftest import SENTENCE, synthesise
from tests.voice.conftest import serve as serve_with_speech
from tests.web.conftest import DESKTOP, launch, screenshot

pytestmark = [pytest.mark.model, pytest.mark.browser]

ANSWER_MS = 180_000
RATE = 16000
LEAD_S, TAIL_S = 1.0, 1.5  # silence around the sentence: the microphone opens a little after the press


@pytest.fixture(scope="module")
def server(cfg, runner, stt):
    with serve_with_speech(cfg, runner, stt) as running:
        yield running


@pytest.fixture(scope="module")
def microphone(tmp_path_factory):
    """A WAV for Chromium's fake microphone, and how long to hold the button for it."""
    folder = tmp_path_factory.mktemp("microphone")
    speech = synthesise(SENTENCE, folder).raw_16k
    pcm = bytes(int(2 * RATE * LEAD_S)) + speech + bytes(int(2 * RATE * TAIL_S))
    path = folder / "microphone.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)
    return path, len(pcm) / (2 * RATE)


@pytest.fixture(scope="module")
def voice_browser(playwright, microphone):
    """A Chromium whose fake microphone plays the WAV once, with the permission prompt answered."""
    path, _ = microphone
    browser = launch(playwright, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                     f"--use-file-for-fake-audio-capture={path}%noloop", "--autoplay-policy=no-user-gesture-required")
    yield browser
    browser.close()


def test_push_to_talk_transcribes_answers_stores_and_reads_aloud(voice_browser, microphone, server, token, api):
    _, seconds = microphone
    context = voice_browser.new_context(base_url=server.url, viewport=DESKTOP, permissions=["microphone"])
    context.add_init_script(f"localStorage.setItem('homeai.token', {token!r});"
                            "window.__spoken = []; speechSynthesis.speak = (u) => window.__spoken.push(u.text);")
    page = context.new_page()
    errors, sockets, events = [], [], []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def watch(ws):  # the voice socket's server events, to say why when no transcript comes
        sockets.append(ws.url)
        ws.on("framereceived", lambda payload: events.append(payload[:200])
              if isinstance(payload, str) and '"response.delta"' not in payload else None)
        ws.on("close", lambda _: events.append("(socket closed)"))
    page.on("websocket", watch)
    try:
        page.goto("/")
        page.get_by_label("Read answers aloud").check()
        mic = page.get_by_role("button", name="Hold to talk")
        expect(mic).to_be_enabled()
        mic.hover()
        page.mouse.down()
        expect(mic).to_have_attribute("aria-pressed", "true")
        page.wait_for_timeout(seconds * 1000)  # hold the button while the sentence plays
        page.mouse.up()

        question = page.locator(".message.user").last
        try:
            expect(question).to_contain_text(re.compile("kitchen", re.I), timeout=ANSWER_MS)
        except AssertionError as e:
            raise AssertionError(f"the words did not show: the server sent {events}; page errors {errors}") from e
        answer = page.get_by_test_id("assistant-message").last
        expect(answer).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=ANSWER_MS)
        text = answer.locator(".bubble").inner_text().strip()
        assert text
        expect(mic).to_have_attribute("aria-pressed", "false")
        expect(page.get_by_test_id("send-button")).to_be_visible(timeout=ANSWER_MS)
        screenshot(page, "desktop-voice")

        cid = int(re.search(r"#c/(\d+)$", page.url).group(1))

        def stored():
            messages = api.get(f"/api/conversations/{cid}").json()["messages"]
            return messages if len(messages) == 2 else None
        messages = wait_for(stored)
        assert messages and messages[0]["role"] == "user" and "kitchen" in messages[0]["content"].lower()
        assert messages[1]["role"] == "assistant" and messages[1]["content"]
        expect(page.locator("#chat-title")).to_contain_text(re.compile("kitchen", re.I))  # titled by what was said
        spoken = page.evaluate("window.__spoken")
        assert len(spoken) == 1 and spoken[0]
        assert sockets and not any(token in url or "token=" in url for url in sockets)  # signed in by session.start
        assert not errors
    finally:
        context.close()
