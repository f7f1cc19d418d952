"""`homeai bench members`: one member's chat beside another member's flood, over HTTP.

Run: `homeai bench members [--samples 20] [--streams 30] [--stream-tokens 300] [--seed 0] [--out bench-out]`.
Starts the daemon in-process on a free loopback port (the configured model, a throwaway database,
auth on) and adds three members: bob, who chats; alice, who may use the chat and voice lanes; and
carol, who may not use voice. In each phase bob sends `samples` short streamed chats to
`/v1/chat/completions` one after another (a seeded question, a think pause between them), timed
from sending to the first content chunk, while another member does one thing:

* idle: nothing (the baseline every ratio is taken against, measured in the same run);
* voice refused: carol's flood (as below) on the voice lane, which she may not use: every request
  should be a 403 (a refused sender tries again after `retry_s`, as a client backing off would);
* refused grammar: alice sends `response_format` json_schemas too large to build (an enum of
  50,000 strings, `maxItems` 100000) from `grammar_senders` senders, each again `grammar_pause_s`
  after its refusal; they should be 400s before they reach the engine;
* chat flood: alice keeps `streams` streams of `stream_tokens` tokens in flight on the chat lane
  (each asks for a long story, sampled, so it runs to `max_tokens`; a finished one is sent again);
* voice flood: the same with `X-HomeAI-Lane: voice`, a lane alice may use;
* idle again: nothing (how far the machine drifted over the run, the floods' cached prefixes kept).

Bob's chat gets `timeout_s` for its answer and his phase `phase_max_s` (past it, the chats not yet
sent count as unanswered). Between phases the flooder's requests are cancelled and the engine
drains. Targets (issue 26):
beside a flood, bob's TTFT p95 <= 1 s and <= 3x idle p95; beside refused requests, every one
refused as expected and no change beyond noise (p50 and p95 within `NO_CHANGE`x idle). Writes
`members.json` and `members.md` under `--out`.
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

from homeai.bench.assistant_bench import _serving, _wait_loaded
from homeai.config import AuthConfig, Config, DatabaseConfig, WyomingConfig
from homeai.engine.stats import percentile

TARGET_P95_MS = 1000.0  # beside a flood: bob's TTFT p95 at most this...
TARGET_FLOOD_RATIO = 3.0  # ...and at most this many times his idle p95
NO_CHANGE = 1.5  # beside refused requests: p50 and p95 within this many times idle (this CPU's noise)
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
    timeout_s: float = 60.0  # bob's longest wait for an answer; longer counts as unanswered
    phase_max_s: float = 240.0  # bob's chats of a phase not sent by then count as unanswered
    seed: int = 0


QUICK = Shape(samples=2, bob_tokens=4, streams=2, stream_tokens=16, grammar_senders=1, retry_s=1.0)


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    load: str  # "none", "streams" or "grammar"
    flooder: str | None = None
    lane: str | None = None  # the flooder's X-HomeAI-Lane
    expect: int = 200  # the status the flooder's requests should get


# The refused phases come right after idle: a flood leaves its prefixes in the prompt cache, whose
# cells later steps attend over (bob's idle TTFT after the floods is up to 1.5x), so "no change"
# is judged in the state the idle baseline was measured in; "idle again" shows the floods' residue.
PHASES = (Phase("idle", "none"),
          Phase("voice refused", "streams", "carol", "voice", expect=403),
          Phase("refused grammar", "grammar", "alice", expect=400),
          Phase("chat flood", "streams", "alice", "chat"),
          Phase("voice flood", "streams", "alice", "voice"),
          Phase("idle again", "none"))

# Lanes each member may use (bob and carol: the defaults, which leave voice out).
MEMBER_LANES = {"bob": None, "alice": ("chat", "voice", "summaries", "embeddings", "indexing"), "carol": None}


def main(cfg: Config, args) -> int:
    """`homeai bench members` with its command-line arguments."""
    import sys

    shape = dataclasses.replace(QUICK, seed=args.seed) if args.quick else Shape(
        samples=args.samples, streams=args.streams, stream_tokens=args.stream_tokens, seed=args.seed)
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


async def stream_chat(client: httpx.AsyncClient, body: dict, headers: dict | None = None,
                      on_status=None, on_chunk=None, answer: Answer | None = None) -> Answer:
    """One streamed chat completion, read to its end, into `answer` (the caller's, so what came
    before a timeout is kept); `on_status(code)` once the answer's head came, `on_chunk()` per
    content chunk."""
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
            answer.tokens = (chunk.get("usage") or {}).get("completion_tokens", answer.tokens)
            for choice in chunk.get("choices", ()):
                content = choice.get("delta", {}).get("content")
                if content:
                    answer.chunks += 1
                    if on_chunk:
                        on_chunk()
                if answer.first_s is None and (content or choice.get("finish_reason")):
                    answer.first_s = time.perf_counter() - sent
    answer.total_s = time.perf_counter() - sent
    return answer


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

    def __init__(self, client: httpx.AsyncClient, phase: Phase, shape: Shape):
        self.client, self.phase, self.shape = client, phase, shape
        self.rng = random.Random(f"{shape.seed}:{phase.name}:flood")
        self.statuses: collections.Counter = collections.Counter()
        self.heard: set[int] = set()  # senders whose first request has its status
        self.chunks = self.finished_streams = self.finished_tokens = self.transport_errors = 0  # tokens: usage
        self.errors: list[str] = []  # what the refusals said, each different message once (at most 3)
        self.tasks: list[asyncio.Task] = []
        self.started_at = self.stopped_at = 0.0

    def start(self) -> None:
        n = self.shape.streams if self.phase.load == "streams" else self.shape.grammar_senders
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
                answer = await (self._grammar(i, (i + n) % 2) if self.phase.load == "grammar" else self._stream(i))
            except httpx.HTTPError as e:  # the daemon closed the connection: counted, tried again
                self.transport_errors += 1
                self.heard.add(i)
                answer = Answer(None, error=f"{type(e).__name__}: {e}")
            n += 1
            if answer.status != 200:
                if answer.error and answer.error not in self.errors and len(self.errors) < 3:
                    self.errors.append(answer.error)
                await asyncio.sleep(self.shape.grammar_pause_s if self.phase.load == "grammar" else self.shape.retry_s)
            elif self.phase.load == "streams":
                self.finished_streams += 1
                self.finished_tokens += answer.tokens or 0

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
                "tokens_per_s": round(self.chunks / seconds, 1), "seconds": round(seconds, 1),
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


async def run_phases(url: str, tokens: dict[str, str], shape: Shape, drained, progress) -> tuple[list, dict]:
    """Every phase in turn: bob's samples and each flood's summary."""
    def client(member: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {tokens[member]}"},
                                 timeout=httpx.Timeout(600.0),
                                 # below uvicorn's 5 s keep-alive (httpx's default is 5 s too): a sender
                                 # back from its 5 s pause would reuse a connection the server is closing
                                 limits=httpx.Limits(max_connections=shape.streams + 8, keepalive_expiry=2.0))

    samples, floods = [], {}
    async with client("bob") as bob, client("alice") as alice, client("carol") as carol:
        for _ in range(2):  # warm-up: the template's prefix cached, first-call costs paid
            await stream_chat(bob, bob_body(random.Random(-1), shape.bob_tokens))
        flooders = {"alice": alice, "carol": carol}
        for phase in PHASES:
            flood = Flood(flooders[phase.flooder], phase, shape) if phase.flooder else None
            if flood:
                flood.start()
                await flood.ready()
            started = time.perf_counter()
            samples += await bob_phase(bob, phase, shape)
            if flood:
                await flood.stop()
                floods[phase.name] = flood.summary()
            await asyncio.to_thread(drained)
            beside = f"; {phase.flooder}'s statuses {floods[phase.name]['statuses']}" if flood else ""
            progress(f"  {phase.name}: {_line(samples, phase.name)} ({time.perf_counter() - started:.0f} s){beside}",
                     flush=True)
    return samples, floods


def _line(samples: list[Sample], phase: str) -> str:
    ttfts = [s.ttft_ms for s in samples if s.phase == phase and s.ttft_ms is not None]
    return f"bob's TTFT p50 {percentile(ttfts, 50)} ms, p95 {percentile(ttfts, 95)} ms"


def run(cfg: Config, *, shape: Shape = Shape(), out: Path = Path("bench-out"), runner=None,
        command: str = "homeai bench members", progress=print) -> dict:
    """Every phase over a daemon of `cfg` (with `runner`: that loaded model, for tests); the report,
    also written to `out`."""
    from homeai.api.app import create_app

    with tempfile.TemporaryDirectory(prefix="homeai-bench-members-") as tmp:
        cfg = dataclasses.replace(
            cfg, auth=AuthConfig(required=True), database=DatabaseConfig(url=f"sqlite:///{Path(tmp) / 'bench.db'}"),
            server=dataclasses.replace(cfg.server, host="127.0.0.1", data_dir=tmp),
            wyoming=WyomingConfig(enabled=False))
        app = create_app(cfg, runner=runner)
        with _serving(app) as url:
            runtime = app.state.runtime
            _wait_loaded(runtime)
            tokens = add_members(cfg)
            model = runtime.engine.runner.info.description
            machine = _machine(cfg, runtime.engine.runner)
            progress(f"model {model}; {shape.samples} chats a phase beside {shape.streams} streams of "
                     f"{shape.stream_tokens} tokens", flush=True)
            samples, floods = asyncio.run(run_phases(url, tokens, shape, lambda: drain(runtime.engine), progress))
    report = build_report(shape, samples, floods, model=model, machine=machine)
    write(report, out, command)
    for line in report["findings"]:
        progress(line, flush=True)
    progress(f"report in {out / 'members.md'}", flush=True)
    return report


def add_members(cfg: Config) -> dict[str, str]:
    """bob, alice and carol, as `homeai members add NAME [--lanes ...]` makes them; their tokens."""
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


# ---- the report ---------------------------------------------------------------------------------


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def bob_figures(samples: list[Sample]) -> dict:
    ttfts = [s.ttft_ms for s in samples if s.ttft_ms is not None]
    return {"n": len(samples), "sent": sum(s.sent for s in samples), "answered": len(ttfts),
            "whole": sum(s.total_ms is not None for s in samples),
            "statuses": dict(collections.Counter(str(s.status) for s in samples)),
            "ttft_ms": {"p50": percentile(ttfts, 50), "p95": percentile(ttfts, 95), "max": max(ttfts, default=None)}}


def verdict(phase: Phase, bob: dict, idle: dict, flood: dict | None) -> tuple[str, str]:
    """The phase's target in words, and "pass", "fail" or "no figure"."""
    p50, p95 = bob["ttft_ms"]["p50"], bob["ttft_ms"]["p95"]
    r50, r95 = _ratio(p50, idle["ttft_ms"]["p50"]), _ratio(p95, idle["ttft_ms"]["p95"])
    if phase.load == "none":
        return ("baseline" if phase.name == "idle" else "drift: none expected"), "-"
    everyone = bob["answered"] == bob["n"]
    if phase.expect == 200:
        target = f"p95 <= {TARGET_P95_MS:g} ms and <= {TARGET_FLOOD_RATIO:g}x idle p95"
        ok = None if r95 is None else (everyone and p95 <= TARGET_P95_MS and r95 <= TARGET_FLOOD_RATIO)
    else:
        refused = (bool(flood) and flood["requests"] > 0 and not flood.get("transport_errors")
                   and flood["statuses"] == {str(phase.expect): flood["requests"]})
        target = f"every request {phase.expect}; p50 and p95 <= {NO_CHANGE:g}x idle"
        ok = None if r50 is None or r95 is None else (everyone and refused and max(r50, r95) <= NO_CHANGE)
    return target, "no figure" if ok is None else ("pass" if ok else "fail")


def build_report(shape: Shape, samples: list[Sample], floods: dict, *, model: str, machine: str = "") -> dict:
    idle = bob_figures([s for s in samples if s.phase == "idle"])
    phases = {}
    for phase in PHASES:
        bob = bob_figures([s for s in samples if s.phase == phase.name])
        target, result = verdict(phase, bob, idle, floods.get(phase.name))
        phases[phase.name] = {
            "bob": bob, "flood": floods.get(phase.name),
            "p50_over_idle": _ratio(bob["ttft_ms"]["p50"], idle["ttft_ms"]["p50"]),
            "p95_over_idle": _ratio(bob["ttft_ms"]["p95"], idle["ttft_ms"]["p95"]),
            "target": target, "result": result}
    report = {"bench": "members", "model": model, "machine": machine, "shape": dataclasses.asdict(shape),
              "phases": phases,
              "samples": [dataclasses.asdict(s) for s in samples]}
    report["findings"] = findings(report)
    return report


def findings(report: dict) -> list[str]:
    lines = []
    for name, p in report["phases"].items():
        ttft, flood = p["bob"]["ttft_ms"], p["flood"]
        beside = f" beside {flood['member']} ({flood['load']} on {flood['lane']}: {flood['statuses']})" if flood else ""
        lines.append(f"{name}: bob's TTFT p50 {ttft['p50']} ms, p95 {ttft['p95']} ms ({p['p50_over_idle']}x / "
                     f"{p['p95_over_idle']}x idle){beside}; target {p['target']}: {p['result']}")
    return lines


def markdown(report: dict, command: str) -> str:
    s = report["shape"]
    rows = ["| phase | the other member | their requests (status: count) | their tokens/s | bob's chats answered "
            "| TTFT p50 / p95 (ms) | p50 / p95 over idle | target | result |",
            "|---|---|---|---:|---:|---:|---:|---|---|"]
    for name, p in report["phases"].items():
        f, b = p["flood"], p["bob"]
        who = f"{f['member']}: {_what(f)}" if f else "-"
        statuses = ", ".join(f"{k}: {v}" for k, v in f["statuses"].items()) if f else "-"
        rows.append(f"| {name} | {who} | {statuses} | {f['tokens_per_s'] if f else '-'} | {b['answered']}/{b['n']} | "
                    f"{b['ttft_ms']['p50']} / {b['ttft_ms']['p95']} | {p['p50_over_idle']} / {p['p95_over_idle']} | "
                    f"{p['target']} | {p['result']} |")
    errors = [f"* {name}: {error}" for name, p in report["phases"].items() if p["flood"]
              for error in p["flood"]["errors"]]
    text = ["# One member beside another", "", f"Command: `{command}`", "",
            f"Bob sends {s['samples']} streamed chats a phase ({s['bob_tokens']} tokens, "
            f"one after another), timed to the first content chunk, each given {s['timeout_s']:g} s and the phase "
            f"{s['phase_max_s']:g} s; a flood keeps {s['streams']} streams of {s['stream_tokens']} tokens in flight "
            f"(a finished one is sent again); a stream refused its lane is sent again after {s['retry_s']:g} s, a "
            f"refused grammar {s['grammar_pause_s']:g} s after its refusal ({s['grammar_senders']} at once). "
            f"Seed {s['seed']}.", "", f"Machine: {report['machine']}", "", *rows, "",
            "Their tokens/s: content chunks a second over the phase (tokens per finished stream: "
            f"{_per_stream(report)}); bob's ratios are against his idle phase of this run.", "",
            *(["What the refused requests were told:", "", *errors, ""] if errors else []),
            *[f"* {line}" for line in report["findings"]], ""]
    return "\n".join(text)


def _per_stream(report: dict) -> str:
    return ", ".join(f"{name} {p['flood']['tokens_per_finished_stream'] or 'none finished'}"
                     for name, p in report["phases"].items()
                     if p["flood"] and p["flood"]["load"] == "streams" and p["flood"]["expected_status"] == 200)


def _what(flood: dict) -> str:
    if flood["load"] == "grammar":
        return f"json_schemas too large to build, {flood['senders']} at once"
    allowed = "" if flood["expected_status"] == 200 else ", a lane not allowed"
    return f"{flood['senders']} streams on {flood['lane']}{allowed}"


def write(report: dict, out: Path, command: str = "homeai bench members") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "members.json").write_text(json.dumps({**report, "command": command}, indent=2))
    (out / "members.md").write_text(markdown(report, command))
