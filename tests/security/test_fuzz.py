"""Property-based fuzzing (Hypothesis) of what a client sends, against a real server with auth on:
the JSON bodies of every POST route, and the voice socket's JSON text frames and binary frames.

The properties: no 500 (every refusal is a 4xx in OpenAI's error shape, with a code), no hang
(every read has a timeout), the keep-alive connection still answers afterwards, and the voice
socket is never dropped: it answers a last `session.start` with `session.ready`, or it was
closed with a close frame and a code. Bodies are near-valid (each field valid, of the wrong
type, out of range, a lone surrogate, or any JSON) so that many reach the model; the server
allows 4 output tokens, so whatever gets through answers quickly.

Run: .venv/bin/python -m pytest tests/security/test_fuzz.py
(a deeper run: HOMEAI_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest tests/security/test_fuzz.py)
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed

from tests.security.conftest import TIMEOUT, event, voice_socket

pytestmark = pytest.mark.model

EXAMPLES = int(os.environ.get("HOMEAI_FUZZ_EXAMPLES", "0"))  # 0: each test's own number
RATE = 16000
EVENTS = {"session.ready", "error", "transcript.final", "response.delta", "response.done"}
CLOSE_CODES = {4401}  # a session.start with a wrong token signs the socket out


def fuzz(num_examples: int):
    """Hypothesis' settings for one fuzz test: `num_examples` (cheap ones get more), no time limits."""
    return settings(max_examples=EXAMPLES or num_examples, deadline=None, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- values ---------------------------------------------------------------------------

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
# (st.text() would drop the surrogates from its alphabet)
texts = st.one_of(st.text(max_size=24), st.lists(st.characters() | surrogates, max_size=8).map("".join))
numbers = st.one_of(st.integers(-3, 300), st.integers(), st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30]),
                    st.floats(), st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e400]))
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=8)


def encoded(value) -> bytes:
    """JSON as any client may write it: \\u escapes (lone surrogates too), Infinity and NaN."""
    return json.dumps(value).encode()


def weighted(strategy: st.SearchStrategy, times: int, other: st.SearchStrategy) -> st.SearchStrategy:
    """`strategy` `times` in `times + 1` draws, else `other` (st.one_of takes each branch once)."""
    return st.sampled_from([strategy] * times + [other]).flatmap(lambda chosen: chosen)


def field(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A field's value: mostly of the valid kind (its edges included), else anything JSON can carry.
    Mostly: a body has many fields, and one wrong is enough to keep it from the model."""
    return weighted(valid, 9, json_values)


def body(required: dict, optional: dict) -> st.SearchStrategy:
    """Bodies as bytes: mostly JSON objects of the route's fields, else any JSON, else any bytes."""
    fields = st.fixed_dictionaries({k: field(v) for k, v in required.items()},
                                   optional={k: field(v) for k, v in optional.items()})
    junk = st.one_of(json_values.map(encoded), st.binary(max_size=64), st.text(max_size=64).map(str.encode))
    return weighted(fields.map(encoded), 6, junk)


def mostly(*valid, edges: st.SearchStrategy) -> st.SearchStrategy:
    """One of the `valid` values 2 in 3 draws, else one of the `edges`."""
    return weighted(st.sampled_from(valid), 2, edges)


def small(n: int) -> st.SearchStrategy:
    return st.integers(0, n)


MAX_TOKENS = mostly(1, 2, 4, edges=small(6))  # the server allows 4
SAMPLING = {
    "max_tokens": MAX_TOKENS, "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": small(100),
    "min_p": st.floats(0, 1), "repeat_penalty": st.floats(0.5, 2), "seed": st.integers(),
    "n": mostly(1, edges=small(2)),
    "stop": texts | st.lists(texts, max_size=3), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "lane": mostly("chat", "voice", edges=st.sampled_from(["summaries", "indexing", "embeddings", "nope"])),
    "model": mostly(None, edges=texts),
}
content_parts = st.lists(st.fixed_dictionaries({"type": field(st.just("text")), "text": field(texts)}), max_size=2)
chat_messages = st.lists(st.fixed_dictionaries(
    {"role": field(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))},
    optional={"content": field(texts | content_parts)}), min_size=1, max_size=3)
token_ids = st.lists(st.integers(-2, 60_000) | numbers, max_size=4)

ROUTES = {
    "/v1/chat/completions": body({"messages": chat_messages}, {
        **SAMPLING, "max_completion_tokens": MAX_TOKENS, "logprobs": st.booleans(), "top_logprobs": small(21),
        "documents": st.booleans()}),
    "/v1/completions": body({"prompt": texts | token_ids | st.lists(texts, max_size=2)}, {
        **SAMPLING, "logprobs": small(21), "echo": st.booleans()}),
    "/v1/embeddings": body(
        {"input": texts | st.lists(texts, max_size=3) | token_ids | st.lists(token_ids, max_size=2)},
        {"model": SAMPLING["model"], "lane": mostly("embeddings", edges=SAMPLING["lane"]),
         "encoding_format": st.sampled_from(["float", "base64"]), "dimensions": st.integers(0, 1000)}),
    "/api/conversations": body({}, {"title": texts}),
    "messages": body({"content": texts}, {"max_tokens": MAX_TOKENS, "temperature": st.floats(0, 2)}),
    "regenerate": body({}, {"max_tokens": MAX_TOKENS, "temperature": st.floats(0, 2)}),
}


# ---- HTTP ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def asked(http) -> int:
    """A conversation with one question, its answer replaced by each regenerate."""
    conversation = http.post("/api/conversations", json={}).json()["id"]
    http.post(f"/api/conversations/{conversation}/messages", json={"content": "Hi", "max_tokens": 1})
    return conversation


def path_of(http, route: str, asked: int) -> str:
    if route == "regenerate":
        return f"/api/conversations/{asked}/regenerate"
    if route == "messages":  # a fresh conversation each time: in a growing one each prompt is longer
        return f"/api/conversations/{http.post('/api/conversations', json={}).json()['id']}/messages"
    return route


def check_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["code"] and error["message"] and error["type"], error
    elif response.headers.get("content-type", "").startswith("text/event-stream"):  # and it ended cleanly
        last = [line for line in response.text.splitlines() if line.startswith("data: ")][-1].removeprefix("data: ")
        assert last == "[DONE]" or json.loads(last)["type"] in ("response.done", "error"), response.text[-500:]


@pytest.mark.parametrize("route", list(ROUTES))
def test_fuzzed_bodies(http, asked, route):
    @fuzz(30)
    @given(data=ROUTES[route])
    def run(data: bytes):
        path = path_of(http, route, asked)
        check_answer(http.post(path, content=data, headers={"Content-Type": "application/json"}))

    run()
    assert http.get("/v1/models").status_code == 200  # and the connection still answers


# ---- the voice socket ----------------------------------------------------------------------

session_starts = st.fixed_dictionaries(
    {"type": st.just("session.start"), "sample_rate": field(st.sampled_from([RATE, 8000, 48000, 44100]))},
    optional={"language": field(st.sampled_from([None, "en", "de"])), "vad": field(st.booleans()),
              "conversation_id": field(st.integers(-1, 3) | st.sampled_from([2**63, 2**64])),
              "token": weighted(st.none(), 2, texts)})  # a wrong one closes the socket (4401)
messages_of_the_protocol = weighted(session_starts, 2, st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["audio.end", "response.cancel"])}),
    st.fixed_dictionaries({"type": field(st.sampled_from(["audio.end", "response.cancel", "session.start"]))},
                          optional={"x": json_values}),
))
junk_text = st.one_of(json_values.map(encoded).map(bytes.decode), st.text(max_size=40))  # JSON or not at all
text_frames = weighted(messages_of_the_protocol.map(encoded).map(bytes.decode), 4, junk_text)
# Audio: short frames of silence or noise (odd lengths too); an utterance of it may be transcribed.
audio_frames = st.binary(max_size=2048) | st.integers(0, 2048).map(bytes)


def still_answers(ws) -> None:
    """The socket answers a last session.start, or was closed with a close frame and a known code."""
    try:
        ws.send(json.dumps({"type": "session.start", "sample_rate": RATE}))
        while True:
            message = event(ws, TIMEOUT)
            assert message.get("type") in EVENTS, message
            if message["type"] == "error":
                assert message["code"] and message["message"], message
            if message["type"] == "session.ready":
                return
    except ConnectionClosed:
        assert ws.protocol.close_rcvd is not None, "dropped without a close frame"
        assert ws.close_code in CLOSE_CODES, (ws.close_code, ws.close_reason)


def send_all(ws, frames) -> None:
    try:
        for frame in frames:
            ws.send(frame)
    except ConnectionClosed:
        pass  # closed meanwhile: still_answers says whether properly


def test_fuzzed_text_frames(server, token):
    @fuzz(60)
    @given(frames=st.lists(weighted(text_frames, 4, audio_frames), min_size=1, max_size=5))
    def run(frames):
        with voice_socket(server, token) as ws:
            send_all(ws, frames)
            still_answers(ws)

    run()


def test_fuzzed_audio_frames(server, token):
    @fuzz(40)
    @given(rate=st.sampled_from([RATE, 8000, 48000]), vad=st.booleans(),
           frames=st.lists(audio_frames, min_size=1, max_size=6), end=st.booleans())
    def run(rate, vad, frames, end):
        with voice_socket(server, token) as ws:
            ws.send(json.dumps({"type": "session.start", "sample_rate": rate, "vad": vad}))
            assert event(ws)["type"] == "session.ready"
            send_all(ws, [*frames, *([json.dumps({"type": "audio.end"})] if end else [])])
            still_answers(ws)

    run()


def test_an_event_is_one_line_whatever_a_client_splits_lines_by(http, asked):
    """Found by the fuzz: text with U+2028 (or U+0085, U+2029) is valid inside a JSON string and was
    sent raw, so a client splitting the stream with str.splitlines, or with httpx's line reader (the
    ollama package's), cut an event in two and could not parse it. Each stays one line now."""
    text = "lamp\u2028on\x85off\u2029dim"
    response = http.post(path_of(http, "messages", asked), json={"content": text, "max_tokens": 2})
    data = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    events = [json.loads(d) for d in data if d != "[DONE]"]  # each line parses whole
    assert events and any(text in json.dumps(e, ensure_ascii=False) for e in events)  # the text came back intact
    lines = list(httpx._decoders.LineDecoder().decode(response.text))
    assert all(json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {"))
