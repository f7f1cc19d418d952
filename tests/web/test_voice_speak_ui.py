"""The page speaks, in a real Chromium: a push-to-talk answer's audio frames arrive over
`/v1/voice` and play as they come (the page's player schedules them on an AudioContext and counts
the buffers it played), a message's read-aloud button streams `/v1/audio/speech` and plays it,
speaking again stops playback, and the mute toggle stops it and asks the next answer in words.

Run: .venv/bin/python -m pytest tests/web/test_voice_speak_ui.py
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.api.conftest import serve
from tests.web.conftest import DESKTOP, screenshot
from tests.web.test_voice_ui import microphone, voice_browser  # noqa: F401  (fixtures: the fake microphone)

pytestmark = [pytest.mark.model, pytest.mark.browser]

ANSWER_MS = 180_000


@pytest.fixture(scope="module")
def server(cfg, runner, stt, tts):
    with serve(cfg, runner, stt=stt, tts=tts) as running:
        yield running


def stats(page) -> dict:
    return page.evaluate("({...homeaiPlayer.stats, time: homeaiPlayer.context && homeaiPlayer.context.currentTime})")


def test_a_spoken_answer_plays_as_it_arrives_and_a_message_is_read_aloud(voice_browser, microphone, server,  # noqa: F811
                                                                            token, tts):
    _, seconds = microphone
    context = voice_browser.new_context(base_url=server.url, viewport=DESKTOP, permissions=["microphone"])
    context.add_init_script(f"localStorage.setItem('homeai.token', {token!r});"
                            "window.__spoken = []; speechSynthesis.speak = (u) => window.__spoken.push(u.text);")
    page = context.new_page()
    errors, starts, frames, speech_requests = [], [], [], []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def watch(ws):
        ws.on("framesent", lambda payload: starts.append(json.loads(payload)) if isinstance(payload, str)
              and '"session.start"' in payload else None)
        ws.on("framereceived", lambda payload: frames.append(len(payload)) if isinstance(payload, bytes) else None)
    page.on("websocket", watch)
    page.on("request", lambda r: speech_requests.append(r) if r.url.endswith("/v1/audio/speech") else None)
    try:
        page.goto("/")
        page.get_by_label("Read answers aloud").check()  # the browser's voice: not used when the server speaks
        mic = page.get_by_role("button", name="Hold to talk")
        mute = page.get_by_role("button", name="Mute spoken answers")
        expect(mute).to_have_attribute("aria-pressed", "false")
        mic.hover()
        page.mouse.down()
        expect(mic).to_have_attribute("aria-pressed", "true")
        page.wait_for_timeout(seconds * 1000)
        page.mouse.up()

        # Frames arrive and play while the answer is still being written or synthesised.
        page.wait_for_function("() => homeaiPlayer.stats.played > 0", timeout=ANSWER_MS)
        first = stats(page)
        assert first["sampleRate"] == tts.sample_rate() and first["scheduled"] >= first["played"] > 0
        assert first["time"] > 0  # the AudioContext's clock runs: it is playing
        answer = page.get_by_test_id("assistant-message").last
        expect(answer).not_to_have_class(re.compile(r"\bstreaming\b"), timeout=ANSWER_MS)
        expect(page.get_by_test_id("send-button")).to_be_visible(timeout=ANSWER_MS)
        assert starts[0]["speak"] is True and frames
        for _ in range(50):  # Playwright reports the socket's frames a little after the page saw them
            if stats(page)["received"] == len(frames):
                break
            page.wait_for_timeout(100)
        assert stats(page)["received"] == len(frames)  # every frame the socket brought was handed to the player
        assert page.evaluate("window.__spoken") == []  # spoken once, by the server's voice
        screenshot(page, "desktop-voice-speaking")

        # Read aloud: the answer's own button streams /v1/audio/speech and plays it.
        page.evaluate("homeaiPlayer.stop()")
        before = stats(page)
        read = answer.get_by_role("button", name="Read aloud")
        read.click()
        expect(read).to_have_attribute("aria-pressed", "true")
        # Playing now (a one-sentence answer is one buffer, counted as played only once it has ended,
        # so `scheduled`, not `played`): the press below must find it playing.
        page.wait_for_function(f"() => homeaiPlayer.stats.scheduled > {before['scheduled']} && homeaiPlayer.stats.playing",
                               timeout=ANSWER_MS)
        request = speech_requests[-1]
        body = json.loads(request.post_data)
        assert body["response_format"] == "pcm" and body["input"].strip()
        assert request.headers["authorization"] == f"Bearer {token}"
        assert stats(page)["sampleRate"] == 24000

        # Speaking again stops playback at once (the press; the fake microphone is silent now).
        mic.hover()
        page.mouse.down()
        assert stats(page)["playing"] is False
        expect(read).to_have_attribute("aria-pressed", "false")
        page.mouse.up()
        expect(page.get_by_test_id("send-button")).to_be_visible(timeout=ANSWER_MS)  # nothing heard: no answer

        # Muting stops what plays, and the next push-to-talk asks for words only.
        read.click()
        page.wait_for_function("() => homeaiPlayer.stats.playing", timeout=ANSWER_MS)
        mute.click()
        expect(mute).to_have_attribute("aria-pressed", "true")
        assert stats(page)["playing"] is False
        num_starts = len(starts)
        mic.hover()
        page.mouse.down()
        expect(mic).to_have_attribute("aria-pressed", "true")
        page.wait_for_timeout(1500)
        page.mouse.up()
        expect(page.get_by_test_id("send-button")).to_be_visible(timeout=ANSWER_MS)
        assert len(starts) > num_starts and starts[-1]["speak"] is False
        assert page.evaluate("localStorage.getItem('homeai.muted')") == "1"
        assert not errors
    finally:
        context.close()
