"""The loads of `homeai bench members` that issue 55 added, and carol's spoken turns beside every phase.

What one of alice's (or a guest's) senders does once, as `members_bench.Flood` repeats it:

* `nested_pattern`: a `response_format` json_schema whose string pattern nests six unbounded
  repeats (`NESTED_PATTERN`) behind a leading `const` property, asking for ~70 tokens;
* `slow_grammar`: a json_schema within every static bound whose cost is in its weighing: an array
  of 60 strings, each one of 100 that share a 40-character prefix, so every token it writes is
  weighed against ~100 live alternatives (tens of ms each, under `[grammar] max_token_ms`). The
  checker's walks spend half of `[grammar] build_timeout_s` on it and then accept it (no token past
  `max_token_ms`), so it is served, each token within `[grammar] step_budget_ms`; each sender's
  next one waits for the member's checks, past `max_pending_checks_per_member` a 429. Each
  request's grammar is new (its own suffixes), so no kept answer is given early;
* `speech_stream`: a `/v1/audio/speech` stream of a long text on the chat lane, read a chunk at a
  time with a pause between (held open, as a slow listener would);
* `trickle`: a guest's raw socket (no token): a request head whole with its `Content-Length`,
  then the body one byte every few seconds; what the daemon does with it is the answer (a status,
  or the connection closed).

`carol_turns`: carol's spoken questions over `/v1/voice` (`"speak": true`), each timed from
`audio.end` to the answer's first audio frame (`voice_bench._ask`, the voice bench's client).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import httpx

from homeai.bench.voice_bench import QUESTIONS as SPOKEN_QUESTIONS
from homeai.bench.voice_bench import RATE, _ask, synthesise

NESTED_PATTERN = "^(((((([a-z])+)+)+)+)+)+[a-z]{40}$"  # issue 55's: each token weighed for seconds, before the fix
SLOW_ITEMS, SLOW_ALTERNATIVES, SLOW_PREFIX = 60, 100, 40
SPEECH_TEXT = " ".join(["The lighthouse keeper counted the waves until morning, and the whale sang back."] * 12)
TRICKLE_BODY_BYTES = 4096  # the Content-Length the head promises


@dataclasses.dataclass
class Outcome:
    """What one request came to: a status (None: no answer), an error message, chunks read."""

    status: int | str | None
    error: str | None = None
    chunks: int = 0


def nested_pattern_body() -> bytes:
    schema = {"type": "object", "properties": {"kind": {"const": "code"},
                                               "code": {"type": "string", "pattern": NESTED_PATTERN}},
              "required": ["kind", "code"]}
    return _json_schema_request(schema, "nested", "Write a code.", max_tokens=70)


def slow_grammar_body(n: int) -> bytes:
    """The `n`th slow grammar (each different: its alternatives' suffixes are its own)."""
    prefix = "a" * SLOW_PREFIX
    first = n * SLOW_ALTERNATIVES
    schema = {"type": "array", "minItems": SLOW_ITEMS, "maxItems": SLOW_ITEMS,
              "items": {"type": "string", "enum": [f"{prefix}{k:07d}" for k in range(first, first + SLOW_ALTERNATIVES)]}}
    return _json_schema_request(schema, "slow", "Pick some.", max_tokens=8)


def _json_schema_request(schema: dict, name: str, question: str, *, max_tokens: int) -> bytes:
    return json.dumps({"model": "homeai", "messages": [{"role": "user", "content": question}],
                       "max_tokens": max_tokens, "temperature": 0.7,
                       "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}}
                      ).encode()


async def post_json(client: httpx.AsyncClient, body: bytes) -> Outcome:
    response = await client.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    return Outcome(response.status_code, None if response.status_code == 200 else _error(response.text))


async def speech_stream(client: httpx.AsyncClient, read_pause_s: float, on_status, on_chunk) -> Outcome:
    """One `/v1/audio/speech` stream read slowly to its end; `on_chunk()` per chunk read."""
    body = {"model": "tts-1", "voice": "alloy", "input": SPEECH_TEXT, "response_format": "pcm"}
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        on_status(response.status_code)
        if response.status_code != 200:
            return Outcome(response.status_code, _error((await response.aread()).decode("utf-8", "replace")))
        outcome = Outcome(200)
        async for _ in response.aiter_raw(16384):
            outcome.chunks += 1
            on_chunk()
            await asyncio.sleep(read_pause_s)
        return outcome


async def trickle(host: str, port: int, source: str, interval_s: float, on_open) -> Outcome:
    """A guest's request (from the address `source`) whose body comes a byte at a time; what the
    daemon did with it."""
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
    except OSError as e:
        return Outcome("connect failed", f"{type(e).__name__}: {e}")
    try:
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {TRICKLE_BODY_BYTES}\r\n\r\n".encode())
        await writer.drain()
        on_open()
        for _ in range(TRICKLE_BODY_BYTES):
            try:  # the daemon's answer, if it gives one before the next byte is due
                head = await asyncio.wait_for(reader.readline(), interval_s)
            except (TimeoutError, asyncio.TimeoutError):
                writer.write(b"{")
                await writer.drain()
                continue
            return _answered(head, await _rest(reader))
        return Outcome("body sent whole")
    except OSError as e:
        return Outcome("closed", f"{type(e).__name__}: {e}")
    finally:
        writer.close()


def _answered(head: bytes, rest: bytes) -> Outcome:
    """An HTTP status line (and what follows) as an outcome; an empty one: the daemon closed it."""
    parts = head.decode("latin-1").split()
    if len(parts) < 2 or not parts[1].isdigit():
        return Outcome("closed")
    body = rest.split(b"\r\n\r\n", 1)[-1].decode("utf-8", "replace")
    return Outcome(int(parts[1]), _error(body))


async def _rest(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(2048), 2.0)
    except (TimeoutError, asyncio.TimeoutError, OSError):
        return b""


def _error(text: str) -> str:
    """The error's message (no more than 200 characters), else the body's start."""
    try:
        return str(json.loads(text)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return text[:200]


# ---- carol ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Turn:
    phase: str
    index: int
    first_audio_ms: float | None  # audio.end sent -> the answer's first audio frame; None: no audio
    error: str | None = None  # an error event, or the audio refused (tts_busy), or no answer in time


def utterances(n: int) -> list[tuple[str, bytes]]:
    """`n` spoken questions (espeak-ng), made once before the phases."""
    return [(q, synthesise(q)) for q in (SPOKEN_QUESTIONS * (n // len(SPOKEN_QUESTIONS) + 1))[:n]]


async def carol_turns(url: str, token: str, phase: str, spoken: list[tuple[str, bytes]], seed: int,
                      timeout_s: float, source: str) -> list[Turn]:
    """Carol's spoken questions of a phase over one voice session (from the address `source`), one
    after another."""
    from websockets.asyncio.client import connect

    rng = random.Random(f"{seed}:{phase}:carol")
    turns = []
    async with connect(url.replace("http://", "ws://") + "/v1/voice", open_timeout=timeout_s, max_size=None,
                       local_addr=(source, 0)) as ws:
        await ws.send(json.dumps({"type": "session.start", "sample_rate": RATE, "speak": True, "token": token}))
        ready = json.loads(await ws.recv())
        if ready.get("type") != "session.ready":
            return [Turn(phase, i, None, f"session refused: {ready}") for i in range(len(spoken))]
        for i, (question, pcm) in enumerate(spoken):
            try:
                sample = await asyncio.wait_for(_ask(ws, question, pcm, ready.get("audio_sample_rate")), timeout_s)
            except (TimeoutError, asyncio.TimeoutError):
                turns.append(Turn(phase, i, None, f"no answer within {timeout_s:g} s"))
                break  # the socket is mid-answer: the phase's other turns are not asked
            error = None if sample.first_audio_ms is not None else (sample.transcript if sample.ttft_ms is None
                                                                     else "the answer came without audio")
            turns.append(Turn(phase, i, sample.first_audio_ms, error))
            await asyncio.sleep(rng.uniform(0.3, 0.8))
    return turns
