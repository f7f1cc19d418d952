"""`homeai bench owui`: Open WebUI's users behind one trusted proxy member, taking turns with the
body Open WebUI sends (issue 54).

Run: `homeai bench owui [--users 2] [--turns 2] [--max-tokens 32] [--tools 36] [--overlap] [--seed 0]
[--out bench-out]`.
Starts the daemon in-process on a free loopback port (the configured model, a throwaway database,
auth on, uvicorn set up as `homeai serve` sets it up) and adds member `owui` as
`homeai members add owui --proxy` makes it. Each of `users` people (A, B, C, D) then chats through
it: the recorded Open WebUI 0.12.4 chat body (tests/fixtures/open_webui/openai_chat.json: no system
message, the page's 36 built-in tools, streamed), POSTed as it is to `/v1/chat/completions` with
the proxy's token and the user's id in `[clients] proxy_user_header` (X-OpenWebUI-User-Id), with
the user's own short messages and the history growing with the answers. The bench adds what it
needs to the body and nothing to the prompt: `max_tokens` (answers short, so the prompt side is
measured), a `seed` per turn (runs draw the same answers) and `stream_options.include_usage` (the
counts). An answer with tool calls goes into the history with them and an empty result each, as
a client's record of them would; Open WebUI's follow-up request and its background tasks (title,
tags, follow-ups) are left out.

Users take turns: A1 B1 C1 A2 B2 C2 ..., each turn sent once the one before it answered; with
`overlap`, two turns at a time (A1 with B1, C1 with A2, ...), as when one user's message came while
another's cold prompt was read. Timed per turn: sent -> first chunk with content, a tool call or a
finish reason (TTFT), and at the engine (its `on_finish` record) how long the request waited for
admission, e.g. for room in a cache (queue); over the run, each KV cache's peak cells held by live
sequences and with cached prefixes (where the turns were placed). Counted per turn: the usage's
`prompt_tokens` and `cached_tokens`, and the share of the *preamble* found in the cache. The
preamble is what no user wrote: the prompt's tokens before the first one that depends on a user's
message (the longest common prefix of the body's prompt with two different first messages,
rendered as the service renders it, tool plan included). The cache serves a prompt's leading
tokens, so a turn's cached preamble is min(cached, preamble). Reported per turn index, per user,
overall, and from the second user's first turn on, against issue 54's target there: >= 90% of the
preamble cached on every turn and TTFT p95 <= 5 s. "From the second user's first turn on" is every
turn but the cold read: the one that found least of the preamble cached, the first answered among
equals (A1 one at a time; with `overlap`, whichever of A1 and B1 read it while the other shared
those cells). Writes `owui.json` and `owui.md` under `--out`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from homeai.bench.assistant_bench import _serving, _wait_loaded
from homeai.bench.members_bench import Answer, _machine, _ms, stream_chat
from homeai.config import AuthConfig, Config, DatabaseConfig, WyomingConfig
from homeai.engine.stats import percentile

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "open_webui" / "openai_chat.json"
PROXY = "owui"
TIMEOUT_S = 900.0  # one turn's longest wait (a cold 6.6k-token prompt behind another took 229 s in the issue)
TARGET_PREAMBLE_SHARE = 0.9  # issue 54's targets, over every turn but the cold read
TARGET_TTFT_P95_MS = 5000.0
# Open WebUI names a user by the id of its account (a UUID)
USER_IDS = {"A": "8c1f3a52-7d0e-4b8e-9a51-2f6c0d9e1b27", "B": "0f9e8d7c-6b5a-4c3d-8e2f-1a0b9c8d7e6f",
            "C": "3b7e2c19-5a4d-4f6e-8c1b-9d0a2e3f4b5c", "D": "e4d3c2b1-a0f9-4e8d-b7c6-5a4b3c2d1e0f"}
MESSAGES = {  # each user's own messages, a turn each (cycled past the last)
    "A": ["What can you do for me today?", "Can you suggest a dinner for four?", "How long should the rice cook?",
          "What could we have for dessert?"],
    "B": ["Which board game suits a family evening?", "How many people can play it?", "Is it hard to learn?",
          "What snacks go well with it?"],
    "C": ["How do I get a coffee stain out of a cotton shirt?", "Does that work on wool too?",
          "Should I use warm or cold water?", "How do I dry it afterwards?"],
    "D": ["When should I plant tomatoes outside?", "How often do they need water?", "Do they need a stake?",
          "When are they ready to pick?"],
}


@dataclasses.dataclass(frozen=True)
class Shape:
    users: int = 2  # people behind the proxy (2 to 4)
    turns: int = 2  # each user's messages
    max_tokens: int = 32  # each answer's length: short, so the prompt side is measured
    tools: int = 36  # the first this many of the recorded body's 36 tools (fewer: a shorter preamble, for tests)
    overlap: bool = False  # two turns at a time instead of one
    seed: int = 0

    def __post_init__(self):
        if not 2 <= self.users <= len(USER_IDS):
            raise ValueError(f"users must be 2 to {len(USER_IDS)}, got {self.users}")
        for name in ("turns", "max_tokens", "tools"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


QUICK = Shape(users=2, turns=2, max_tokens=4, tools=3)  # tests and smoke runs: a ~700-token preamble


def main(cfg: Config, args) -> int:
    """`homeai bench owui` with its command-line arguments."""
    import sys

    try:
        shape = QUICK if args.quick else Shape(users=args.users, turns=args.turns, max_tokens=args.max_tokens,
                                               tools=args.tools, overlap=args.overlap, seed=args.seed)
        recorded_body(shape.tools)
    except ValueError as e:
        print(f"homeai bench owui: {e}", file=sys.stderr)
        return 2
    run(cfg, shape=shape, out=Path(args.out), command=" ".join(["homeai", *sys.argv[1:]]))
    return 0


# ---- the client side --------------------------------------------------------------------------


def recorded_body(num_tools: int) -> dict:
    """Open WebUI's chat body, with the first `num_tools` of its tools (the recording lives in the
    source tree's tests: the bench runs from a checkout)."""
    if not FIXTURE.is_file():
        raise SystemExit(f"homeai bench owui: {FIXTURE} is missing (run it from a checkout of homeai)")
    body = json.loads(FIXTURE.read_text(encoding="utf-8"))
    if num_tools > len(body["tools"]):
        raise ValueError(f"tools must be at most {len(body['tools'])} (the recorded body's), got {num_tools}")
    return {**body, "tools": body["tools"][:num_tools]}


def rotation(shape: Shape) -> list[list[tuple[str, int]]]:
    """The turns as sent, in groups sent at once: (user, turn) pairs, turns 1-based."""
    slots = [(user, turn) for turn in range(1, shape.turns + 1) for user in list(USER_IDS)[:shape.users]]
    size = 2 if shape.overlap else 1  # two in a row are always two users (users >= 2)
    return [slots[i:i + size] for i in range(0, len(slots), size)]


def message(user: str, turn: int) -> str:
    own = MESSAGES[user]
    text = own[(turn - 1) % len(own)]
    return text if turn <= len(own) else f"{text} (again, {turn})"


def preamble_tokens(runner, body: dict) -> int:
    """The prompt's tokens before the first that depends on what a user wrote, as the service
    renders the body (its tool plan, the model's template)."""
    from homeai.service import prompts

    plan = prompts.tool_plan(runner, body.get("tools"), body.get("tool_choice"))
    a, b = (prompts.chat_tokens(runner, [{"role": "user", "content": text}], prompts.Prompter(runner, plan))
            for text in ("Apples and pears?", "Zebras, quickly!"))
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclasses.dataclass
class Turn:
    order: int  # its place in the rotation (0: the first user's first turn)
    user: str  # "A" to "D"
    turn: int  # the user's own, 1-based
    sent_s: float  # since the first turn was sent
    status: int | None  # None: no answer (a transport error or past the timeout)
    ttft_ms: float | None
    total_ms: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    preamble_cached: float | None  # share of the preamble found in the cache
    queue_ms: float | None = None  # at the engine: arrival to admission
    tool_calls: int = 0
    error: str | None = None


class EngineLog:
    """The engine's record of each finished request (an `engine.on_finish` callback, on its loop
    thread), by member key (`owui/<user>`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_key: dict[str, list] = collections.defaultdict(list)

    def observe(self, stats) -> None:
        with self.lock:
            self.by_key[stats.member].append(stats)

    def count(self, key: str) -> int:
        with self.lock:
            return len(self.by_key[key])

    async def after(self, key: str, n: int, timeout_s: float = 10.0):
        """`key`'s record past its first `n` (the engine records a request just after its last
        event is sent), or None."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            with self.lock:
                if len(self.by_key[key]) > n:
                    return self.by_key[key][n]
            await asyncio.sleep(0.02)
        return None


@contextmanager
def cache_peaks(engine, interval_s: float = 0.25):
    """Each KV cache's peak cells while the block runs, sampled from the engine's state: yields a
    dict filled in when the block ends, {cache: {cells_total, peak_used, peak_held}} (held: live
    sequences' cells and cached prefixes')."""
    peaks: dict[str, dict] = {}
    stop = threading.Event()

    def sample() -> None:
        for name, cache in engine.state().caches.items():
            peak = peaks.setdefault(name, {"cells_total": cache.cells_total, "peak_used": 0, "peak_held": 0})
            peak["peak_used"] = max(peak["peak_used"], cache.cells_used)
            peak["peak_held"] = max(peak["peak_held"], cache.cells_used + cache.cells_cached)

    def watch() -> None:
        while not stop.wait(interval_s):
            sample()

    thread = threading.Thread(target=watch, name="bench-owui-caches", daemon=True)
    sample()
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()
        sample()


class Users:
    """The people behind the proxy: each one's history, and their turns as sent."""

    def __init__(self, url: str, token: str, header: str, model: str, shape: Shape, preamble: int, log: EngineLog,
                 progress):
        self.url, self.header, self.shape, self.preamble, self.progress = url, header, shape, preamble, progress
        self.log = log
        self.auth = {"Authorization": f"Bearer {token}"}
        self.body = {**recorded_body(shape.tools), "model": model}
        self.history: dict[str, list[dict]] = {user: [] for user in list(USER_IDS)[:shape.users]}
        self.turns: list[Turn] = []
        self.started = 0.0

    async def run(self) -> list[Turn]:
        limits = httpx.Limits(max_connections=8, keepalive_expiry=2.0)  # below uvicorn's 5 s keep-alive
        async with httpx.AsyncClient(base_url=self.url, headers=self.auth, timeout=httpx.Timeout(TIMEOUT_S),
                                     limits=limits) as client:
            self.started = time.perf_counter()
            for group in rotation(self.shape):
                await asyncio.gather(*(self._turn(client, user, turn) for user, turn in group))
        return sorted(self.turns, key=lambda t: t.order)

    async def _turn(self, client: httpx.AsyncClient, user: str, turn: int) -> None:
        order = (turn - 1) * self.shape.users + list(USER_IDS).index(user)
        asked = {"role": "user", "content": message(user, turn)}
        body = {**self.body, "messages": [*self.history[user], asked], "max_tokens": self.shape.max_tokens,
                "seed": self.shape.seed * 1000 + order, "stream_options": {"include_usage": True}}
        key, sent, answer = f"{PROXY}/{USER_IDS[user]}", time.perf_counter(), Answer(None)
        before = self.log.count(key)
        try:
            await asyncio.wait_for(stream_chat(client, body, {self.header: USER_IDS[user]}, answer=answer), TIMEOUT_S)
        except (TimeoutError, asyncio.TimeoutError, httpx.HTTPError) as e:  # what came before it is kept
            answer.error = answer.error or f"{type(e).__name__}: {e}"[:200]
        record = await self.log.after(key, before) if answer.status == 200 else None
        queue_ms = None if record is None or record.queue_ms is None else round(record.queue_ms, 1)
        self.history[user] += [asked, *_reply(answer)]
        cached = answer.cached_tokens
        share = None if cached is None else round(min(cached, self.preamble) / self.preamble, 3)
        sample = Turn(order, user, turn, round(sent - self.started, 2), answer.status, _ms(answer.first_s),
                      _ms(answer.total_s), answer.prompt_tokens, cached, share, queue_ms, len(answer.calls),
                      answer.error)
        self.turns.append(sample)
        failed = f"; {answer.error}" if answer.error else ""
        self.progress(f"  {user}{turn}: TTFT {sample.ttft_ms} ms (queued {queue_ms} ms), cached "
                      f"{cached}/{answer.prompt_tokens} (preamble {share}){failed}", flush=True)


def _reply(answer: Answer) -> list[dict]:
    """The answer as the history holds it: the assistant's message, and a result for each call."""
    if not answer.calls:
        return [{"role": "assistant", "content": answer.text}]
    calls = [{**call, "id": call["id"] or f"call_{i}"} for i, call in enumerate(answer.calls)]
    return [{"role": "assistant", "content": answer.text or None, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": call["id"], "content": ""} for call in calls)]


# ---- the run ------------------------------------------------------------------------------------


def run(cfg: Config, *, shape: Shape = Shape(), out: Path = Path("bench-out"), runner=None,
        command: str = "homeai bench owui", progress=print) -> dict:
    """Every turn over a daemon of `cfg` (with `runner`: that loaded model, for tests); the report,
    also written to `out`."""
    from homeai.api.app import create_app
    from homeai.app import Program

    header = cfg.clients.proxy_user_header
    if not header:
        raise SystemExit("homeai bench owui: [clients] proxy_user_header is empty: no proxy user can be named")
    with tempfile.TemporaryDirectory(prefix="homeai-bench-owui-") as tmp:
        cfg = dataclasses.replace(
            cfg, auth=AuthConfig(required=True), database=DatabaseConfig(url=f"sqlite:///{Path(tmp) / 'bench.db'}"),
            server=dataclasses.replace(cfg.server, host="127.0.0.1", data_dir=tmp),
            wyoming=WyomingConfig(enabled=False))
        app = create_app(Program(cfg, runner=runner))
        with _serving(app) as url:
            program = app.state.program
            _wait_loaded(program)
            token = _add_proxy(cfg)
            engine_runner = program.engine.runner
            body = recorded_body(shape.tools)
            preamble = preamble_tokens(engine_runner, body)
            model, machine = engine_runner.info.description, _machine(cfg, engine_runner)
            served = _served_model(url, token)
            progress(f"model {model}; {shape.users} users x {shape.turns} turns through member {PROXY!r}, "
                     f"{len(body['tools'])} tools: a {preamble}-token preamble", flush=True)
            _warm_up(url, token, header, served)
            log, load = EngineLog(), os.getloadavg()
            program.engine.on_finish.append(log.observe)
            with cache_peaks(program.engine) as caches:
                turns = asyncio.run(Users(url, token, header, served, shape, preamble, log, progress).run())
    report = build_report(shape, turns, preamble=preamble, model=model, machine=machine,
                          load=[round(x, 2) for x in (*load, *os.getloadavg())], caches=caches)
    write(report, out, command)
    for line in report["findings"]:
        progress(line, flush=True)
    progress(f"report in {out / 'owui.md'}", flush=True)
    return report


def _add_proxy(cfg: Config) -> str:
    """Member `owui`, a trusted proxy, as `homeai members add owui --proxy` makes it; its token."""
    from homeai.store.db import make_engine, make_sessionmaker
    from homeai.store.members import add_member

    engine = make_engine(cfg.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return add_member(session, name=PROXY, proxy=True)[1]
    finally:
        engine.dispose()


def _served_model(url: str, token: str) -> str:
    """The model id `/v1/models` lists first, as Open WebUI's model picker offers it."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60.0) as http:
        return http.get("/v1/models").json()["data"][0]["id"]


def _warm_up(url: str, token: str, header: str, model: str) -> None:
    """One short chat of a user of its own, without tools (nothing of the preamble cached): the
    first call's costs paid before the measured turns."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}", header: "warm-up"},
                      timeout=TIMEOUT_S) as http:
        http.post("/v1/chat/completions", json=body).raise_for_status()


# ---- the report ---------------------------------------------------------------------------------


def stats(turns: list[Turn]) -> dict:
    """TTFT p50/p95 and what the cache served, over `turns`."""
    ttfts = [t.ttft_ms for t in turns if t.ttft_ms is not None]
    queues = [t.queue_ms for t in turns if t.queue_ms is not None]
    counted = [t for t in turns if t.prompt_tokens is not None and t.cached_tokens is not None]
    prompt, cached = sum(t.prompt_tokens for t in counted), sum(t.cached_tokens for t in counted)
    shares = [t.preamble_cached for t in counted]
    return {"n": len(turns), "answered": sum(t.status == 200 and t.ttft_ms is not None for t in turns),
            "ttft_ms": {"p50": percentile(ttfts, 50), "p95": percentile(ttfts, 95)},
            "queue_ms": {"p50": percentile(queues, 50), "p95": percentile(queues, 95)},
            "prompt_tokens": prompt, "cached_tokens": cached,
            "cached_share": round(cached / prompt, 3) if prompt else None,
            "preamble_cached": {"mean": round(sum(shares) / len(shares), 3) if shares else None,
                                "min": min(shares) if shares else None},
            "tool_calls": sum(t.tool_calls for t in turns)}


def build_report(shape: Shape, turns: list[Turn], *, preamble: int, model: str, machine: str,
                 load: list[float], caches: dict | None = None) -> dict:
    users, first = list(USER_IDS)[:shape.users], cold_read(turns)
    report = {"bench": "owui", "model": model, "machine": machine, "shape": dataclasses.asdict(shape),
              "fixture": str(FIXTURE.relative_to(FIXTURE.parents[3])), "preamble_tokens": preamble,
              "load_average": {"before": load[:3], "after": load[3:]}, "caches": caches or {},
              "by_turn": {str(n): stats([t for t in turns if t.turn == n]) for n in range(1, shape.turns + 1)},
              "by_user": {u: stats([t for t in turns if t.user == u]) for u in users},
              "overall": stats(turns),
              "cold_read": f"{first.user}{first.turn}" if first else None,
              "after_first": stats([t for t in turns if t is not first]),
              "turns": [dataclasses.asdict(t) for t in turns]}
    report["findings"] = findings(report)
    return report


def cold_read(turns: list[Turn]) -> Turn | None:
    """The turn that read the preamble cold: the answered one with least of it cached, the one whose
    first token came first among equals (two sent together share one read, and either may answer
    first; with nothing cached at all, the first answered; one with no usage counted, last)."""
    answered = [t for t in turns if t.ttft_ms is not None]
    return min(answered, key=lambda t: (t.preamble_cached is None, t.preamble_cached or 0.0, t.sent_s * 1000.0 + t.ttft_ms)) if answered else None


def findings(report: dict) -> list[str]:
    """Issue 54's target, from the second user's first turn on, and the cold turn before it."""
    later, first = report["after_first"], report["by_turn"]["1"]
    share, p95 = later["preamble_cached"]["min"], later["ttft_ms"]["p95"]
    met = (later["answered"] == later["n"] and share is not None and p95 is not None
           and share >= TARGET_PREAMBLE_SHARE and p95 <= TARGET_TTFT_P95_MS)  # an unanswered turn misses it
    name = report["cold_read"]
    cold = next((t for t in report["turns"] if f"{t['user']}{t['turn']}" == name), {})
    return [f"from the second user's first turn on: preamble cached {_pct(share)} at least, "
            f"{_pct(later['preamble_cached']['mean'])} on average (target >= {_pct(TARGET_PREAMBLE_SHARE)}); "
            f"TTFT p95 {_n(p95)} ms (target <= {TARGET_TTFT_P95_MS:,.0f} ms): {'met' if met else 'missed'}",
            f"the cold read ({name}): TTFT {_n(cold.get('ttft_ms'))} ms, {cold.get('cached_tokens')} of "
            f"{cold.get('prompt_tokens')} prompt tokens cached; every first turn: TTFT p50 "
            f"{_n(first['ttft_ms']['p50'])} ms, p95 {_n(first['ttft_ms']['p95'])} ms"]


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def _caches_line(caches: dict) -> str:
    peaks = "; ".join(f"{name} {c['peak_used']:,} / {c['peak_held']:,} of {c['cells_total']:,}"
                      for name, c in caches.items())
    return f"KV caches over the turns, peak cells held by live sequences / with cached prefixes: {peaks or '-'}."


def _n(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:,.0f}"


def write(report: dict, out: Path, command: str = "homeai bench owui") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "owui.json").write_text(json.dumps({**report, "command": command}, indent=2))
    s, load = report["shape"], report["load_average"]
    rows = ["| turns | n | answered | TTFT p50 / p95 (ms) | queued p50 / p95 (ms) | prompt tokens cached "
            "| preamble cached, mean / min | tool calls |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    groups = [*((f"turn {n}", g) for n, g in report["by_turn"].items()),
              *((f"user {u}", g) for u, g in report["by_user"].items()),
              ("all", report["overall"]), ("from the second user's first on", report["after_first"])]
    for name, g in groups:
        rows.append(f"| {name} | {g['n']} | {g['answered']} | {_n(g['ttft_ms']['p50'])} / {_n(g['ttft_ms']['p95'])} | "
                    f"{_n(g['queue_ms']['p50'])} / {_n(g['queue_ms']['p95'])} | {_pct(g['cached_share'])} | "
                    f"{_pct(g['preamble_cached']['mean'])} / "
                    f"{_pct(g['preamble_cached']['min'])} | {g['tool_calls']} |")
    each = ["| # | user | turn | sent at (s) | TTFT (ms) | queued (ms) | prompt tokens | cached | preamble cached "
            "| status |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for t in report["turns"]:
        each.append(f"| {t['order'] + 1} | {t['user']} | {t['turn']} | {t['sent_s']:.1f} | {_n(t['ttft_ms'])} | "
                    f"{_n(t['queue_ms'])} | "
                    f"{t['prompt_tokens']} | {t['cached_tokens']} | {_pct(t['preamble_cached'])} | "
                    f"{t['status']}{'; ' + t['error'] if t['error'] else ''} |")
    text = ["# Open WebUI's users behind one proxy member", "", f"Command: `{command}`", "",
            f"{report['machine']}. Member `{PROXY}` (a trusted proxy), {s['users']} users x "
            f"{s['turns']} turns, {'two turns at a time' if s['overlap'] else 'one turn at a time'}; the recorded "
            f"body ({report['fixture']}) with {s['tools']} tools, streamed, answers of {s['max_tokens']} tokens. "
            f"Preamble (the tokens no user wrote): {report['preamble_tokens']}; the turn that read it cold: "
            f"{report['cold_read']}. Queued: at the engine, arrival to admission. Load average "
            f"before "
            f"{', '.join(map(str, load['before']))}, after {', '.join(map(str, load['after']))}.", "",
            *rows, "", *each, "", _caches_line(report.get("caches") or {}), "",
            *[f"* {line}" for line in report["findings"]], ""]
    (out / "owui.md").write_text("\n".join(text))
