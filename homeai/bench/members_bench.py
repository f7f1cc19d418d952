"""`homeai bench members`: one member's chat beside another member's flood, over HTTP.

Run: `homeai bench members [--samples 20] [--streams 30] [--stream-tokens 300] [--carol-turns 10]
[--trickle 1000] [--seed 0] [--out bench-out]`.
Starts the daemon in-process on a free loopback port (the configured model, speech model and
voice, a throwaway database, auth on, uvicorn set up as `homeai serve` sets it up) and adds four
members: bob, who chats; alice, who may use every lane; carol, who speaks (voice and chat); and
dave, who may not use voice. In each phase bob sends `samples` short streamed chats to
`/v1/chat/completions` one after another (a seeded question, a think pause between them), timed
from sending to the first content chunk, and carol asks `carol_turns` spoken questions over
`/v1/voice` with `"speak": true` (answers of at most `carol_tokens` tokens), timed from
`audio.end` to the first audio frame (`members_loads.carol_turns`), while another member does one
thing:

* idle: nothing (the baseline every ratio is taken against, measured in the same run);
* voice refused: dave's flood (as below) on the voice lane, which he may not use: every request
  should be a 403 (a refused sender tries again after `retry_s`, as a client backing off would);
* refused grammar: alice sends `response_format` json_schemas too large to build (an enum of
  50,000 strings, `maxItems` 100000) from `grammar_senders` senders, each again `grammar_pause_s`
  after its refusal; they should be 400s before they reach the engine;
* nested pattern (issue 55): alice's `response_format` with issue 55's nested-quantifier pattern
  behind a leading `const` property, asking for ~70 tokens, from `grammar_senders` senders, again
  and again (`members_loads.nested_pattern_body`);
* slow grammars (issue 55): `slow_grammars` of alice's grammars at once, each new, each taking the
  checker half of `[grammar] build_timeout_s` and then served (`members_loads.slow_grammar_body`);
* speech streams (issue 55): `speech_streams` of alice's `/v1/audio/speech` streams on the chat
  lane, read slowly (`speech_read_pause_s` between chunks: held open);
* trickled bodies (issue 55): a guest (no token) with `trickle_sockets` raw connections, each a
  whole head then a byte of body every `trickle_interval_s` (`members_loads.trickle`);
* chat flood: alice keeps `streams` streams of `stream_tokens` tokens in flight on the chat lane
  (each asks for a long story, sampled, so it runs to `max_tokens`; a finished one is sent again);
* voice flood: the same with `X-HomeAI-Lane: voice`, a lane alice may use;
* idle again: nothing (how far the machine drifted over the run, the floods' cached prefixes kept).

The issue 55 phases' requests may be refused or served, as the daemon decides (their statuses
are reported, not judged); what is judged is bob's and carol's time beside them.

Bob's chat gets `timeout_s` for its answer and his phase `phase_max_s` (past it, the chats not yet
sent count as unanswered). Between phases the flooder's requests are cancelled and the engine
drains. Targets (issues 26 and 55):
beside a flood or an issue 55 load, bob's TTFT p95 and carol's first audio p95 each <= 1 s and
<= 3x their idle p95; beside refused requests, every one refused as expected and no change
beyond noise for bob (p50 and p95 within `NO_CHANGE`x idle), carol's as beside a flood
(`members_report`). Writes `members.json` and `members.md` under `--out`. Without a speech model
or voice, carol's turns are left out (the report says why) and only bob is judged. Each member,
and the guest, connects from a loopback address of their own (`ADDRESSES`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import json
import random
import tempfile
import time
from pathlib import Path

import httpx

from homeai.bench import members_loads as loads
from homeai.bench.assistant_bench import _serving, _wait_loaded
from homeai.bench.members_report import build_report, verdict, write  # noqa: F401 (verdict: the tests')
from homeai.config import AuthConfig, Config, DatabaseConfig, WyomingConfig
from homeai.engine.stats import percentile

DRAIN_S = 120.0  # longest wait for the engine to finish a phase's leftovers
QUESTIONS = ["What should I cook tonight?", "How long do eggs take to boil?", "Is it warm enough for a walk?",
             "What is a good name for a cat?", "How do I descale a kettle?", "When should I water the tomatoes?",
             "What rhymes with orange?", "How many minutes are in a day?"]
SUBJECTS = ["a dragon who learns to bake bread", "a lighthouse keeper and a lost whale", "a robot gardener",
            "a village where it never stops snowing", "two rival beekeepers", "a train that runs on music"]


@dataclasses.dataclass(frozen=True)
class Shape:
    samples: int = 20  # bob's chats per phase
    bob_tokens: int = 8  # tokens of each of bob's answers
    streams: int = 30  # the flooder's streams in flight
    stream_tokens: int = 300  # tokens of each flood stream
    grammar_senders: int = 2  # requests with a refused grammar in flight at once
    retry_s: float = 5.0  # a sender refused a lane sends again after this pause (30 senders: 6 a second)
    grammar_pause_s: float = 0.5  # a grammar sender sends again this long after its refusal
    timeout_s: float = 60.0  # bob's (and each of carol's turns') longest wait; longer counts as unanswered
    phase_max_s: float = 240.0  # bob's chats of a phase not sent by then count as unanswered
    carol_turns: int = 10  # carol's spoken questions a phase
    carol_tokens: int = 32  # the voice lane's answer length (its max_tokens): her turns end soon
    slow_grammars: int = 8  # alice's slow grammars at once
    speech_streams: int = 8  # alice's /v1/audio/speech streams held open
    speech_read_pause_s: float = 1.0  # between two chunks of a speech stream read
    trickle_sockets: int = 1000  # the guest's connections trickling a body
    trickle_interval_s: float = 3.0  # between two bytes of a trickled body
    seed: int = 0


QUICK = Shape(samples=2, bob_tokens=4, streams=2, stream_tokens=16, grammar_senders=1, retry_s=1.0,
              carol_turns=1, carol_tokens=8, slow_grammars=2, speech_streams=2, trickle_sockets=20,
              trickle_interval_s=1.0)


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    load: str  # "none", "streams", "grammar", or issue 55's "pattern", "slow grammar", "speech", "trickle"
    flooder: str | None = None  # "guest": no token
    lane: str | None = None  # the flooder's X-HomeAI-Lane
    expect: int | None = 200  # the status the flooder's requests should get (None: any, reported)


# The refused phases come right after idle: a flood leaves its prefixes in the prompt cache, whose
# cells later steps attend over (bob's idle TTFT after the floods is up to 1.5x), so "no change"
# is judged in the state the idle baseline was measured in; "idle again" shows the floods' residue.
PHASES = (Phase("idle", "none"),
          Phase("voice refused", "streams", "dave", "voice", expect=403),
          Phase("refused grammar", "grammar", "alice", expect=400),
          Phase("nested pattern", "pattern", "alice", expect=None),
          Phase("slow grammars", "slow grammar", "alice", expect=None),
          Phase("speech streams", "speech", "alice", "chat", expect=None),
          Phase("trickled bodies", "trickle", "guest", expect=None),
          Phase("chat flood", "streams", "alice", "chat"),
          Phase("voice flood", "streams", "alice", "voice"),
          Phase("idle again", "none"))

# Lanes each member may use (bob and dave: the defaults, which leave voice out).
EVERY_LANE = ("chat", "voice", "summaries", "embeddings", "indexing")
MEMBER_LANES = {"bob": None, "alice": EVERY_LANE, "carol": EVERY_LANE, "dave": None}
# Each member (and the guest) connects from a loopback address of their own, as from their own
# device on the LAN: the daemon's per-address connection caps count each apart (Linux routes all
# of 127.0.0.0/8 to lo).
ADDRESSES = {"bob": "127.0.0.1", "alice": "127.0.0.2", "carol": "127.0.0.3", "dave": "127.0.0.4", "guest": "127.0.0.5"}


def main(cfg: Config, args) -> int:
    """`homeai bench members` with its command-line arguments."""
    import sys

    shape = dataclasses.replace(QUICK, seed=args.seed) if args.quick else Shape(
        samples=args.samples, streams=args.streams, stream_tokens=args.stream_tokens, carol_turns=args.carol_turns,
        trickle_sockets=args.trickle, seed=args.seed)
    run(cfg, shape=shape, out=Path(args.out), command=" ".join(["homeai", *sys.argv[1:]]))
    return 0


# ---- one request -------------------------------------------------------------------------------


@dataclasses.dataclass
class Answer:
    status: int | None  # None: no answer within the timeout
    first_s: float | None = None  # sent -> first content chunk
    total_s: float | None = None
    chunks: int = 0
    tokens: int | None = None  # the usage chunk's completion_tokens, when asked for
    error: str | None = None
    prompt_tokens: int | None = None  # the usage chunk's, when asked for
    cached_tokens: int | None = None  # of them, found in the prompt cache (its prompt_tokens_details)
    text: str = ""  # the content, whole
    calls: list[dict] = dataclasses.field(default_factory=list)  # tool calls, their streamed parts joined


async def stream_chat(client: httpx.AsyncClient, body: dict, headers: dict | None = None,
                      on_status=None, on_chunk=None, answer: Answer | None = None) -> Answer:
    """One streamed chat completion, read to its end, into `answer` (the caller's, so what came
    before a timeout is kept); `on_status(code)` once the answer's head came, `on_chunk()` per
    content chunk. The first chunk with content, a tool call or a finish reason is the first token."""
    sent, answer = time.perf_counter(), answer or Answer(None)
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        answer.status = response.status_code
        if on_status:
            on_status(response.status_code)
        if response.status_code != 200:
            answer.error = _error((await response.aread()).decode("utf-8", "replace"))
            return answer
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                _usage(answer, chunk["usage"])
            for choice in chunk.get("choices", ()):
                delta = choice.get("delta", {})
                content, calls = delta.get("content"), delta.get("tool_calls")
                if content:
                    answer.chunks += 1
                    answer.text += content
                    if on_chunk:
                        on_chunk()
                for call in calls or ():
                    _join_call(answer.calls, call)
                if answer.first_s is None and (content or calls or choice.get("finish_reason")):
                    answer.first_s = time.perf_counter() - sent
    answer.total_s = time.perf_counter() - sent
    return answer


def _usage(answer: Answer, usage: dict) -> None:
    answer.tokens = usage.get("completion_tokens", answer.tokens)
    answer.prompt_tokens = usage.get("prompt_tokens", answer.prompt_tokens)
    answer.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", answer.cached_tokens)


def _join_call(calls: list[dict], part: dict) -> None:
    """A streamed tool call's part into `calls`: its first part (id, name) opens it, the next ones
    add to its arguments, as OpenAI streams a call."""
    index = part.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call, function = calls[index], part.get("function") or {}
    call["id"] = part.get("id") or call["id"]
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def _error(text: str) -> str:
    """The error's message (no more than 200 characters), else the body's start."""
    try:
        return str(json.loads(text)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return text[:200]


def bob_body(rng: random.Random, tokens: int) -> dict:
    """A short chat: a time of day (so each prompt is new to the cache) and a question."""
    content = f"It is {rng.randrange(24):02d}:{rng.randrange(60):02d}. {rng.choice(QUESTIONS)}"
    return {"model": "homeai", "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
            "temperature": 0.7, "seed": rng.randrange(2**31), "stream": True}


def flood_body(rng: random.Random, tokens: int) -> dict:
    """A long stream: a long story, sampled (greedy, the small model soon ends it), runs to `max_tokens`."""
    content = f"Write a very long story about {rng.choice(SUBJECTS)}. Use at least 2000 words."
    return {"model": "homeai", "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
            "temperature": 0.8, "seed": rng.randrange(2**31), "stream": True,
            "stream_options": {"include_usage": True}}


@functools.cache
def grammar_body(kind: int) -> bytes:
    """A request whose json_schema is too large to build, as JSON: kind 0, an enum of 50,000
    strings (about 700 KB); kind 1, `maxItems` 100000. Made once: the sender's time is not measured."""
    if kind == 0:
        schema = {"type": "string", "enum": [f"value-{n:05d}" for n in range(50_000)]}
    else:
        schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 100_000}
    return json.dumps({"model": "homeai", "messages": [{"role": "user", "content": "Pick one."}], "max_tokens": 8,
                       "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "big", "schema": schema}}}).encode()


# ---- the flooder ---------------------------------------------------------------------------------


class Flood:
    """One member's requests of a phase, kept in flight until `stop()`; what came back counted."""

    def __init__(self, client: httpx.AsyncClient | None, phase: Phase, shape: Shape, url: str = ""):
        self.client, self.phase, self.shape, self.url = client, phase, shape, httpx.URL(url)
        self.rng = random.Random(f"{shape.seed}:{phase.name}:flood")
        self.statuses: collections.Counter = collections.Counter()
        self.heard: set[int] = set()  # senders whose first request has its status
        self.chunks = self.finished_streams = self.finished_tokens = self.transport_errors = 0  # tokens: usage
        self.slow_grammars = 0  # slow grammars sent: each the next one
        self.errors: list[str] = []  # what the refusals said, each different message once (at most 3)
        self.tasks: list[asyncio.Task] = []
        self.started_at = self.stopped_at = 0.0

    def start(self) -> None:
        n = {"streams": self.shape.streams, "slow grammar": self.shape.slow_grammars,
             "speech": self.shape.speech_streams, "trickle": self.shape.trickle_sockets,
             }.get(self.phase.load, self.shape.grammar_senders)
        self.started_at = time.perf_counter()
        self.tasks = [asyncio.create_task(self._sender(i)) for i in range(n)]

    async def ready(self, timeout_s: float = 60.0) -> None:
        """Until every sender's first request has its status and, if any was served, tokens flow."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if len(self.heard) == len(self.tasks) and (self.chunks or 200 not in self.statuses):
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.stopped_at = time.perf_counter()
        for task in self.tasks:
            task.cancel()
        for result in await asyncio.gather(*self.tasks, return_exceptions=True):
            if isinstance(result, Exception):  # a sender failed, not cancelled: the bench's own fault
                raise result

    async def _sender(self, i: int) -> None:
        n = 0
        while True:
            try:
                answer = await self._send(i, n)
            except httpx.HTTPError as e:  # the daemon closed the connection: counted, tried again
                self.transport_errors += 1
                self.heard.add(i)
                answer = Answer(None, error=f"{type(e).__name__}: {e}")
            n += 1
            if answer.status != 200:
                if answer.error and answer.error not in self.errors and len(self.errors) < 3:
                    self.errors.append(answer.error)
                grammar = self.phase.load in ("grammar", "pattern", "slow grammar")
                await asyncio.sleep(self.shape.grammar_pause_s if grammar else self.shape.retry_s)
            elif self.phase.load == "streams":
                self.finished_streams += 1
                self.finished_tokens += answer.tokens or 0

    async def _send(self, i: int, n: int) -> Answer:
        """The sender's `n`th request of the phase's load."""
        load = self.phase.load
        if load == "grammar":
            return await self._grammar(i, (i + n) % 2)
        if load == "streams":
            return await self._stream(i)
        if load == "trickle":
            outcome = await loads.trickle(self.url.host, self.url.port, ADDRESSES["guest"],
                                          self.shape.trickle_interval_s, lambda: self.heard.add(i))
            self._status(i, outcome.status)
        elif load == "speech":
            outcome = await loads.speech_stream(self.client, self.shape.speech_read_pause_s,
                                                lambda status: self._status(i, status), self._chunk)
        else:  # "pattern", "slow grammar"
            if load == "slow grammar":
                self.slow_grammars += 1
            body = loads.nested_pattern_body() if load == "pattern" else loads.slow_grammar_body(self.slow_grammars)
            outcome = await loads.post_json(self.client, body)
            self._status(i, outcome.status)
        return Answer(outcome.status if isinstance(outcome.status, int) else None, error=outcome.error)

    def _status(self, i: int, status: int | None) -> None:
        self.statuses[status] += 1
        self.heard.add(i)

    async def _stream(self, i: int) -> Answer:
        headers = {"X-HomeAI-Lane": self.phase.lane} if self.phase.lane else None
        return await stream_chat(self.client, flood_body(self.rng, self.shape.stream_tokens), headers,
                                 on_status=lambda status: self._status(i, status), on_chunk=self._chunk)

    def _chunk(self) -> None:
        self.chunks += 1

    async def _grammar(self, i: int, kind: int) -> Answer:
        response = await self.client.post("/v1/chat/completions", content=grammar_body(kind),
                                          headers={"Content-Type": "application/json"})
        self._status(i, response.status_code)
        return Answer(response.status_code, error=None if response.status_code == 200 else _error(response.text))

    def summary(self) -> dict:
        seconds = max(self.stopped_at - self.started_at, 1e-9)
        return {"member": self.phase.flooder, "lane": self.phase.lane or "chat", "load": self.phase.load,
                "senders": len(self.tasks), "requests": sum(self.statuses.values()),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items(), key=lambda kv: str(kv[0]))},
                "expected_status": self.phase.expect, "transport_errors": self.transport_errors,
                "finished_streams": self.finished_streams,
                "tokens_per_finished_stream": round(self.finished_tokens / self.finished_streams, 1)
                if self.finished_streams else None,
                "tokens_per_s": round(self.chunks / seconds, 1) if self.phase.load == "streams" else None,
                "seconds": round(seconds, 1),
                "errors": self.errors}


# ---- bob, the phases, the run ------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    phase: str
    index: int
    status: int | None
    ttft_ms: float | None  # None: no first token (refused, failed, past the timeout or not sent)
    total_ms: float | None  # None: not read to its end
    sent: bool = True  # False: the phase's time was up first


async def bob_phase(client: httpx.AsyncClient, phase: Phase, shape: Shape) -> list[Sample]:
    """Bob's chats of a phase, one after another with a seeded think pause between them."""
    rng = random.Random(f"{shape.seed}:{phase.name}:bob")
    samples, deadline = [], time.perf_counter() + shape.phase_max_s
    for i in range(shape.samples):
        body, left = bob_body(rng, shape.bob_tokens), deadline - time.perf_counter()
        if left <= 0:
            samples.append(Sample(phase.name, i, None, None, None, sent=False))
            continue
        answer = Answer(None)
        try:
            await asyncio.wait_for(stream_chat(client, body, answer=answer), min(shape.timeout_s, left))
        except (TimeoutError, asyncio.TimeoutError, httpx.HTTPError):  # what came before it is kept
            pass
        samples.append(Sample(phase.name, i, answer.status, _ms(answer.first_s), _ms(answer.total_s)))
        await asyncio.sleep(rng.uniform(0.2, 0.5))
    return samples


async def carol_phase(url: str, token: str, phase: Phase, shape: Shape, spoken) -> list[loads.Turn]:
    """Carol's spoken turns of a phase (none without speech: `spoken` None)."""
    if not spoken:
        return []
    try:
        return await loads.carol_turns(url, token, phase.name, spoken, shape.seed, shape.timeout_s, ADDRESSES["carol"])
    except (OSError, ValueError, RuntimeError) as e:  # the socket refused or dropped: her turns unanswered
        return [loads.Turn(phase.name, i, None, f"{type(e).__name__}: {e}"[:200]) for i in range(len(spoken))]


async def run_phases(url: str, tokens: dict[str, str], shape: Shape, drained, progress,
                     spoken=None) -> tuple[list, dict, list]:
    """Every phase in turn: bob's samples, each flood's summary, carol's turns (with `spoken`)."""
    def client(member: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {tokens[member]}"},
                                 timeout=httpx.Timeout(600.0),
                                 transport=httpx.AsyncHTTPTransport(local_address=ADDRESSES[member]),
                                 # below uvicorn's 5 s keep-alive (httpx's default is 5 s too): a sender
                                 # back from its 5 s pause would reuse a connection the server is closing
                                 limits=httpx.Limits(max_connections=shape.streams + 8, keepalive_expiry=2.0))

    samples, floods, turns = [], {}, []
    async with client("bob") as bob, client("alice") as alice, client("dave") as dave:
        for _ in range(2):  # warm-up: the template's prefix cached, first-call costs paid
            await stream_chat(bob, bob_body(random.Random(-1), shape.bob_tokens))
        await carol_phase(url, tokens["carol"], Phase("warm-up", "none"), shape, spoken[:1] if spoken else None)
        flooders = {"alice": alice, "dave": dave, "guest": None}
        for phase in PHASES:
            flood = Flood(flooders[phase.flooder], phase, shape, url) if phase.flooder else None
            if flood:
                flood.start()
                await flood.ready()
            started = time.perf_counter()
            bobs, carols = await asyncio.gather(bob_phase(bob, phase, shape),
                                                carol_phase(url, tokens["carol"], phase, shape, spoken))
            samples, turns = samples + bobs, turns + carols
            if flood:
                await flood.stop()
                floods[phase.name] = flood.summary()
            await asyncio.to_thread(drained)
            beside = f"; {phase.flooder}'s statuses {floods[phase.name]['statuses']}" if flood else ""
            progress(f"  {phase.name}: {_line(samples, turns, phase.name)} ({time.perf_counter() - started:.0f} s)"
                     f"{beside}", flush=True)
    return samples, floods, turns


def _line(samples: list[Sample], turns: list, phase: str) -> str:
    ttfts = [s.ttft_ms for s in samples if s.phase == phase and s.ttft_ms is not None]
    audio = [t.first_audio_ms for t in turns if t.phase == phase and t.first_audio_ms is not None]
    return (f"bob's TTFT p50 {percentile(ttfts, 50)} ms, p95 {percentile(ttfts, 95)} ms; "
            f"carol's first audio p50 {percentile(audio, 50)} ms, p95 {percentile(audio, 95)} ms")


def run(cfg: Config, *, shape: Shape = Shape(), out: Path = Path("bench-out"), runner=None, stt=None, tts=None,
        command: str = "homeai bench members", progress=print) -> dict:
    """Every phase over a daemon of `cfg` (with `runner`, `stt` and `tts`: those loaded models, for
    tests); the report, also written to `out`."""
    from homeai.api.app import create_app
    from homeai.app import Program

    with tempfile.TemporaryDirectory(prefix="homeai-bench-members-") as tmp:
        voice = dataclasses.replace(cfg.lanes["voice"], max_tokens=shape.carol_tokens)  # carol's answers end soon
        cfg = dataclasses.replace(
            cfg, auth=AuthConfig(required=True), database=DatabaseConfig(url=f"sqlite:///{Path(tmp) / 'bench.db'}"),
            server=dataclasses.replace(cfg.server, host="127.0.0.1", data_dir=tmp),
            wyoming=WyomingConfig(enabled=False), lanes={**cfg.lanes, "voice": voice})
        app = create_app(Program(cfg, runner=runner, stt=stt, tts=tts))
        with _serving(app) as url:
            program = app.state.program
            _wait_loaded(program)
            tokens = add_members(cfg)
            model = program.engine.runner.info.description
            machine = _machine(cfg, program.engine.runner)
            no_voice = _no_voice(program)
            spoken = loads.utterances(shape.carol_turns) if no_voice is None else None
            progress(f"model {model}; {shape.samples} chats a phase beside {shape.streams} streams of "
                     f"{shape.stream_tokens} tokens; carol: {no_voice or f'{shape.carol_turns} spoken turns a phase'}",
                     flush=True)
            samples, floods, turns = asyncio.run(
                run_phases(url, tokens, shape, lambda: drain(program.engine), progress, spoken))
    report = build_report(shape, PHASES, samples, floods, model=model, machine=machine, turns=turns, no_voice=no_voice)
    write(report, out, command)
    for line in report["findings"]:
        progress(line, flush=True)
    progress(f"report in {out / 'members.md'}", flush=True)
    return report


def _no_voice(program) -> str | None:
    """Why carol cannot speak (no speech model, no voice), or None."""
    if program.stt is None:
        return f"no spoken turns: {program.stt_error or 'no speech model'}"
    if program.tts is None:
        return f"no spoken turns: {program.tts_error or 'no voice'}"
    return None


def add_members(cfg: Config) -> dict[str, str]:
    """bob, alice, carol and dave, as `homeai members add NAME [--lanes ...]` makes them; their tokens."""
    from homeai.store.db import make_engine, make_sessionmaker
    from homeai.store.members import add_member

    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return {name: add_member(session, name=name, lanes=lanes)[1] for name, lanes in MEMBER_LANES.items()}
    finally:
        engine.dispose()


def _machine(cfg: Config, runner) -> str:
    from homeai.bench.suite import _machine as described
    from homeai.threads import default_threads

    n = cfg.model.n_threads or default_threads()
    return f"{described(runner)}, {n} thread{'' if n == 1 else 's'}"


def drain(engine, timeout_s: float = DRAIN_S) -> None:
    """Until no lane has a request queued or running (a cancelled stream is aborted within a step)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(lane.queued or lane.running for lane in engine.state().lanes.values()):
            break
        time.sleep(0.1)
    time.sleep(0.5)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)
