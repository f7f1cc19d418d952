"""`POST /v1/audio/speech` through the `openai` client: what homeai says is heard back by faster-whisper.

Auth is required here, as on a household's LAN server; the voice lane is a member's right.
Run: .venv/bin/python -m pytest tests/api/test_audio_speech.py
"""

from __future__ import annotations

import io
import json
import wave

import httpx
import openai
import pytest

from tests.api.conftest import TIMEOUT, add_token, api_config, serve, wait_for
from tests.conftest import heard_share

pytestmark = pytest.mark.model

SAID = "The garage door is closed and the porch light is on."
MAX_CHARS = 300


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, tts={"max_chars": MAX_CHARS})


@pytest.fixture(scope="module")
def server(cfg, runner, stt, tts):
    with serve(cfg, runner, stt=stt, tts=tts) as running:
        yield running


@pytest.fixture(scope="module")
def token(cfg, server):
    return add_token(cfg, "alice")


@pytest.fixture(scope="module")
def client(server, token):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0)


def refused(client, status: int = 400, **fields) -> dict:
    """The error object of a refused speech request."""
    request = {"model": "tts-1", "voice": "alloy", "input": SAID, **fields}
    with pytest.raises(openai.APIStatusError) as caught:
        client.audio.speech.create(**request)
    assert caught.value.status_code == status, caught.value
    return caught.value.response.json()["error"]


def wav_fields(data: bytes) -> tuple[int, int, int, bytes]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), w.readframes(w.getnframes())


# ---- heard back ----------------------------------------------------------------------------

def test_wav_is_heard_back(client, stt):
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input=SAID, response_format="wav")
    data = audio.content
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    rate, channels, width, pcm = wav_fields(data)
    assert (rate, channels, width) == (22050, 1, 2) and len(pcm) > 2 * rate
    share, heard = heard_share(stt, pcm, rate, SAID)
    assert share >= 0.7, heard
    # A streamed WAV's lengths are unknown: a decoder (PyAV's, as a player's) reads to the end.
    assert heard_share_of_file(stt, data) >= 0.7


def heard_share_of_file(stt, data: bytes) -> float:
    from tests.conftest import words

    heard = set(words(stt.transcribe_file(data, "en").text))
    said = words(SAID)
    return sum(w in heard for w in said) / len(said)


def test_pcm_streams_at_openais_24_khz_and_is_heard_back(client, stt):
    text = "Good evening. The oven is preheated. Dinner is at seven."
    with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="en_US-joe-medium",
                                                            input=text, response_format="pcm") as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert response.headers["x-homeai-sample-rate"] == "24000"
        assert "content-length" not in response.headers  # streamed as it is synthesised
        pcm = b"".join(response.iter_bytes())
    assert len(pcm) % 2 == 0 and len(pcm) > 2 * 24000 * 2
    share, heard = heard_share(stt, pcm, 24000, text)
    assert share >= 0.7, heard


def test_wav_is_the_default_format_and_speed_shortens_it(client):
    normal = client.audio.speech.create(model="tts-1", voice="nova", input="One two three four five six.").content
    fast = client.audio.speech.create(model="tts-1", voice="nova", input="One two three four five six.",
                                      speed=2.0).content
    assert normal[:4] == fast[:4] == b"RIFF"
    assert len(wav_fields(fast)[3]) < 0.75 * len(wav_fields(normal)[3])


def test_markdown_is_not_read_out(client, stt):
    text = "## Note\n**Bold** claim with `code` and [a link](https://example.com/x)."
    pcm = wav_fields(client.audio.speech.create(model="tts-1", voice="alloy", input=text).content)[3]
    heard = stt.transcribe_pcm16(pcm, 22050).text.lower()
    assert "claim" in heard and "link" in heard
    for markup in ("asterisk", "star", "backtick", "hash", "http", "slash"):
        assert markup not in heard, heard


# ---- refused, naming the field -------------------------------------------------------------

def test_an_unknown_voice_is_400_naming_voice_and_the_voices(client):
    error = refused(client, voice="darth")
    assert error["param"] == "voice" and "en_US-joe-medium" in error["message"] and "darth" in error["message"]


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_input_is_400_naming_input(client, text):
    error = refused(client, input=text)
    assert error["param"] == "input" and "empty" in error["message"]


def test_input_over_max_chars_is_400_naming_input(client):
    error = refused(client, input="word " * (MAX_CHARS // 5 + 1))
    assert error["param"] == "input" and str(MAX_CHARS) in error["message"]


def test_input_of_code_only_is_400(client):
    error = refused(client, input="```\nprint(1)\n```")
    assert error["param"] == "input" and "nothing to say" in error["message"]


@pytest.mark.parametrize("text, what", [("Hello\x00 there.", "U+0000"), ("The bell\x07 rings.", "U+0007"),
                                        ("Colour\x1b[31m red.", "U+001B"), ("Next\x85 line.", "U+0085"),
                                        ("Delete\x7f this.", "U+007F")])
def test_a_control_character_in_input_is_400_naming_input(client, text, what):
    """A NUL was a 500 (piper's C side: "embedded null character"); every control character but tab
    and line breaks is refused before the pool is asked."""
    error = refused(client, input=text)
    assert (error["param"], error["code"]) == ("input", "invalid_text") and what in error["message"], error
    assert client.audio.speech.create(model="tts-1", voice="alloy", input="Tabs\tand\r\nbreaks are said.").content


def test_a_lone_surrogate_in_input_is_400_naming_input(server, token):
    """The `openai` client cannot even encode one (UTF-8 cannot carry it); JSON's escape can."""
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": "Half a face \ud83d here."})
    assert "\\ud83d" in body
    r = httpx.post(f"{server.url}/v1/audio/speech", content=body, timeout=TIMEOUT,
                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("input", "invalid_text"), error


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "aac", "ogg"])
def test_a_format_not_made_is_400_naming_response_format(client, fmt):
    error = refused(client, response_format=fmt)
    assert error["param"] == "response_format" and "wav" in error["message"] and "pcm" in error["message"]


@pytest.mark.parametrize("speed", [0.1, 4.5, 0])
def test_a_speed_out_of_range_is_400_naming_speed(client, speed):
    assert refused(client, speed=speed)["param"] == "speed"


def test_sse_streaming_is_400_naming_stream_format(client, server, token):
    r = httpx.post(f"{server.url}/v1/audio/speech", headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT,
                   json={"model": "tts-1", "voice": "alloy", "input": SAID, "stream_format": "sse"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_format"


# ---- who may ask ---------------------------------------------------------------------------

def test_without_a_key_it_is_401(server):
    anonymous = openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-a-token", timeout=TIMEOUT, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.audio.speech.create(model="tts-1", voice="alloy", input=SAID)
    r = httpx.post(f"{server.url}/v1/audio/speech", json={"input": SAID}, timeout=TIMEOUT)
    assert r.status_code == 401


def test_the_voice_lane_needs_the_right_to_it(cfg, server, client):
    limited = add_token(cfg, "guest", lanes=None)  # a new member's default lanes leave voice out
    guest = openai.OpenAI(base_url=f"{server.url}/v1", api_key=limited, timeout=TIMEOUT, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        guest.audio.speech.create(model="tts-1", voice="alloy", input=SAID, extra_headers={"X-HomeAI-Lane": "voice"})
    assert caught.value.response.json()["error"]["code"] == "lane_not_allowed"
    assert guest.audio.speech.create(model="tts-1", voice="alloy", input="Hello.").content[:4] == b"RIFF"
    # A member with the voice lane asks for it by header or by the model's name.
    voiced = client.audio.speech.create(model="tts-1:voice", voice="alloy", input="Hello.")
    assert voiced.content[:4] == b"RIFF"
    with pytest.raises(openai.BadRequestError):  # an unknown lane
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.", extra_headers={"X-HomeAI-Lane": "nope"})


# ---- busy ----------------------------------------------------------------------------------

def test_a_pool_without_room_for_the_lane_is_503_with_retry_after_and_voice_keeps_its_own(client, tts,
                                                                                           monkeypatch):
    """The box's busy (503) is not the member's own (429, tests/security/test_speech_share.py): with
    only the voice lane's reserve left, a chat read-aloud waits and a voice one is still made."""
    monkeypatch.setattr(tts.admission, "max_pending", tts.admission.voice_reserve)
    with pytest.raises(openai.InternalServerError) as caught:
        client.audio.speech.create(model="tts-1", voice="alloy", input=SAID)
    assert caught.value.status_code == 503 and caught.value.response.headers["retry-after"] == "1"
    error = caught.value.response.json()["error"]
    assert error["code"] == "tts_busy" and "tts.max_pending" in error["message"], error
    assert client.audio.speech.create(model="tts-1:voice", voice="alloy", input="Hello.").content[:4] == b"RIFF"


# ---- a client that leaves ------------------------------------------------------------------

def test_a_client_that_leaves_stops_the_synthesis(server, token, tts, monkeypatch):
    made = []
    synthesize = tts.synthesize

    def counted(text, **kwargs):
        for chunk in synthesize(text, **kwargs):
            made.append(text)
            yield chunk

    monkeypatch.setattr(tts, "synthesize", counted)
    text = " ".join(f"This is sentence {n} of a long reading." for n in range(1, 8))  # under MAX_CHARS
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        with http.stream("POST", "/v1/audio/speech", headers={"Authorization": f"Bearer {token}"},
                         json={"input": text, "voice": "alloy", "response_format": "pcm"}) as response:
            assert response.status_code == 200
            next(response.iter_raw())  # the first sentence's audio, then the client hangs up
    assert wait_for(lambda: tts.num_pending == 0, timeout=120)
    assert len(made) <= 4, made  # not the whole reading: a sentence or two past the hang-up at most
