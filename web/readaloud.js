// Read aloud: a message's text spoken by the server's voice (POST /v1/audio/speech, raw PCM16
// streamed) and played as it arrives. One reading at a time: another message's button, the same
// button again, a new spoken answer or speaking again stops it.

import { post } from "./api.js";
import { plainText } from "./markdown.js";
import { player } from "./player.js";

// The icon is drawn by style.css (a mask), not an inline SVG: the messages hold no SVG
// (tests/web/test_chat_ui.py checks replies stay inert), and no emoji font is needed.
const SPEAKER = '<span class="speaker-icon" aria-hidden="true"></span>';
const PCM_RATE = 24000; // OpenAI's raw `pcm` (the server also says it in X-HomeAI-Sample-Rate)

let reading = null; // {button, controller, streamed}

// The button under a message: `text()` gives what to read (Markdown is fine: it is not spoken).
export function readAloudButton(text, notify) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "quiet small read-aloud";
  button.setAttribute("aria-label", "Read aloud");
  button.setAttribute("aria-pressed", "false");
  button.title = "Read aloud";
  button.innerHTML = SPEAKER;
  button.addEventListener("click", () => {
    if (reading && reading.button === button) stopReading();
    else readAloud(button, text(), notify);
  });
  return button;
}

async function readAloud(button, text, notify) {
  stopReading();
  const input = plainText(text).trim();
  if (!input) return;
  player.unlock(); // in the click: browsers start audio only after a gesture
  const controller = new AbortController();
  const mine = { button, controller, streamed: false };
  reading = mine;
  button.setAttribute("aria-pressed", "true");
  try {
    const response = await post("/v1/audio/speech", { input, response_format: "pcm" }, { signal: controller.signal });
    player.begin(Number(response.headers.get("x-homeai-sample-rate")) || PCM_RATE);
    const reader = response.body.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done || reading !== mine) break;
      player.push(value);
    }
    mine.streamed = true;
    if (reading === mine && !player.playing) stopReading();
  } catch (e) {
    if (reading === mine) stopReading();
    if (e.name !== "AbortError") notify(e.code === "tts_unavailable" ? "Reading aloud is not available on this server."
      : e.message);
  }
}

// Stop the reading in progress (its download and its playback).
export function stopReading() {
  const current = reading;
  if (!current) return;
  reading = null;
  current.controller.abort();
  current.button.setAttribute("aria-pressed", "false");
  player.stop();
}

player.onchange = () => {
  if (reading && reading.streamed && !player.playing) {
    reading.button.setAttribute("aria-pressed", "false");
    reading = null;
  }
};
