"""`homeai bench multiturn`: assistant conversations that re-send a long stable prompt every turn.

Each member holds a conversation of `turns` turns: a stable system prompt (`system_len`
tokens, the same for every member, as Home Assistant's instructions, device list and tools
are) plus the history so far plus `user_len` new tokens; the assistant answers
`output_len` tokens, and the member's next turn comes `think_s` after the answer ends, its
prompt carrying that answer's tokens. Closed loop: a turn's prompt depends on the previous
answer, so the driver here (not `driver.py`, whose arrivals are fixed) adds each turn when its
member is ready. Optionally the background lanes are kept saturated meanwhile: long
documents to summarise and chunks to index, a new one as each finishes.

Compared: homeai with prompt reuse on and off, and the baselines (`fifo`, `static`,
`serial`, given the prompt cache too, as llama-server's `cache_prompt` keeps each slot's
last prompt). Whose cells a member may reuse (issue 26): `homeai` as configured
(`scheduler.prompt_cache_shared`, false by default: each member reuses only its own
prefixes, so the members' first turns each read the stable prompt), `homeai-shared` every
member's (the opt-in, and homeai before issue 26), `homeai-public` per member with the stable
prompt counted as text no member wrote (`Request.public_len`: a lane's configured prompt, the
template's default system prompt), which every member may reuse. Reported per policy: turn-1 and later-turn TTFT p50/p95, their ratio, and the
share of prompt tokens read from the cache. Output: `<out>/multiturn.json` and `.md`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from homeai.bench.driver import _VirtualClock, _WallClock
from homeai.bench.policies import make_scheduler
from homeai.engine.stats import percentile
from homeai.sched.request import Kind, Request, SamplingParams
from homeai.sched.scheduler import SchedulerLimits
from lanes.base import LanePolicy

POLICIES = ("homeai", "homeai-shared", "homeai-public", "homeai-no-reuse", "fifo", "static", "serial")
# How each homeai variant's prompt cache differs from the configured one (`scheduler_limits`).
CACHE = {"homeai-no-reuse": {"prompt_cache": False}, "homeai-shared": {"prompt_cache_shared": True},
         "homeai-public": {"prompt_cache_shared": False}}


@dataclass(frozen=True)
class Shape:
    members: int = 3
    turns: int = 6
    system_len: int = 1500
    user_len: int = 30
    output_len: int = 24
    think_s: float = 0.5
    background: bool = False  # keep the summaries and indexing lanes saturated
    doc_len: int = 1500
    seed: int = 0


@dataclass
class Turn:
    member: str
    index: int
    arrival: float
    prompt_len: int
    first_token: float | None = None
    cached: int = 0


@dataclass
class Conversation:
    member: str
    history: list[int]
    turns_done: int = 0
    ready_at: float = 0.0
    live: Request | None = None
    turns: list[Turn] = field(default_factory=list)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


def run_policy(policy: str, shape: Shape, lanes: dict[str, LanePolicy], limits: SchedulerLimits, runner, *,
               simulated: bool, max_seconds: float = 900.0) -> dict:
    """One policy over the conversations; its turns and prompt-cache figures."""
    sched = make_scheduler("homeai" if policy.startswith("homeai") else policy, lanes,
                           replace(limits, **{"prompt_cache": True, **CACHE.get(policy, {})}))
    public_len = shape.system_len if policy == "homeai-public" else 0
    runner.reset()
    clock = _VirtualClock() if simulated else _WallClock()
    t0 = clock.now()
    rng = random.Random(shape.seed)
    system = _tokens(rng, shape.system_len)
    talks = [Conversation(f"member{m}", list(system), ready_at=t0 + 0.05 * m) for m in range(shape.members)]
    ids = iter(range(10**9))
    background: dict[str, Request] = {}
    params = SamplingParams(temperature=0, max_tokens=shape.output_len, ignore_eos=True)
    while True:
        now = clock.now()
        for talk in talks:
            if talk.live is None and talk.turns_done < shape.turns and now >= talk.ready_at:
                talk.history += _tokens(rng, shape.user_len)
                talk.live = Request(f"{talk.member}-t{talk.turns_done}", "chat", talk.member, list(talk.history),
                                    now, params=params, public_len=public_len)
                talk.turns.append(Turn(talk.member, talk.turns_done, now, len(talk.history)))
                sched.add_request(talk.live)
        busy = any(t.live is not None or t.turns_done < shape.turns for t in talks)
        if shape.background and busy:
            _keep_background(sched, background, rng, shape, now, ids)
        if not busy or now - t0 > max_seconds:
            break
        plan = sched.schedule(now)
        if plan.empty:
            if not plan.idle:
                runner.run(plan)
            waits = [t.ready_at for t in talks if t.live is None and t.turns_done < shape.turns]
            nxt = sched.next_wakeup(now)
            clock.sleep_until(min([*waits, *([nxt] if nxt and nxt > now else [])], default=now + 0.001))
            continue
        result = runner.run(plan)
        end = clock.advance(result.elapsed_ms / 1000.0)
        for out in sched.update(plan, result, end):
            request = out.request
            talk = next((t for t in talks if t.live is request), None)
            if talk is None:
                background.pop(request.request_id, None) if out.finished else None
                continue
            turn = talk.turns[-1]
            if out.sample is not None and turn.first_token is None:
                turn.first_token, turn.cached = end, request.num_cached_tokens
            if out.finished:
                if turn.first_token is None:
                    turn.first_token, turn.cached = end, request.num_cached_tokens
                talk.history += request.output_tokens
                talk.turns_done += 1
                talk.live = None
                talk.ready_at = end + shape.think_s
    for request_id in list(background):
        sched.abort(request_id, "abort", clock.now())
    return _figures([t for talk in talks for t in talk.turns])


def _keep_background(sched, background: dict[str, Request], rng: random.Random, shape: Shape, now: float,
                     ids) -> None:
    """Two documents being summarised and eight chunks being indexed at all times."""
    lanes = {"summaries": sum(1 for r in background.values() if r.lane == "summaries"),
             "indexing": sum(1 for r in background.values() if r.lane == "indexing")}
    for lane, want, kind, length, params in (
            ("summaries", 2, Kind.GENERATE, shape.doc_len, SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)),
            ("indexing", 8, Kind.EMBED, 200, SamplingParams(max_tokens=1))):
        for _ in range(want - lanes[lane]):
            request = Request(f"bg-{next(ids)}", lane, "jobs", _tokens(rng, length), now, kind=kind, params=params)
            sched.add_request(request)
            background[request.request_id] = request


def _figures(turns: list[Turn]) -> dict:
    def ms(values):
        return {f"p{q}": (None if (v := percentile(values, q)) is None else round(v * 1000, 1)) for q in (50, 95)}
    first = [t.first_token - t.arrival for t in turns if t.index == 0 and t.first_token is not None]
    later = [t.first_token - t.arrival for t in turns if t.index > 0 and t.first_token is not None]
    prompt = sum(t.prompt_len for t in turns)
    cached = sum(t.cached for t in turns)
    later_prompt = sum(t.prompt_len for t in turns if t.index > 0)
    later_cached = sum(t.cached for t in turns if t.index > 0)
    p50_first, p50_later = percentile(first, 50), percentile(later, 50)
    return {"turns": len(turns), "answered": sum(t.first_token is not None for t in turns),
            "turn1_ttft_ms": ms(first), "later_ttft_ms": ms(later),
            "later_over_turn1_p50": round(p50_later / p50_first, 3) if p50_first and p50_later else None,
            "hit_rate": round(cached / prompt, 3) if prompt else 0.0,
            "later_hit_rate": round(later_cached / later_prompt, 3) if later_prompt else 0.0}


def run(shapes: dict[str, Shape], lanes: dict[str, LanePolicy], limits: SchedulerLimits, runner, *,
        simulated: bool, policies=POLICIES, progress=None) -> dict:
    """Every scenario under every policy."""
    doc = {"scenarios": {}}
    for name, shape in shapes.items():
        results = {}
        for policy in policies:
            results[policy] = run_policy(policy, shape, lanes, limits, runner, simulated=simulated)
            if progress:
                progress(name, policy, results[policy])
        doc["scenarios"][name] = {"shape": shape.__dict__, "policies": results}
    return doc


def findings(doc: dict) -> list[str]:
    lines = []
    for name, scenario in doc["scenarios"].items():
        r = scenario["policies"]
        home, off = r.get("homeai"), r.get("homeai-no-reuse")
        if home:
            target = "<= 0.2" if scenario["shape"]["background"] else "<= 0.1"
            lines.append(f"{name}: homeai later-turn / turn-1 TTFT p50 {home['later_over_turn1_p50']} "
                         f"(target {target}); later turns' prompt tokens from the cache {home['later_hit_rate']}")
        if home and off and home["later_ttft_ms"]["p50"] and off["later_ttft_ms"]["p50"]:
            lines.append(f"{name}: later-turn TTFT p50 with reuse / without "
                         f"{home['later_ttft_ms']['p50'] / off['later_ttft_ms']['p50']:.3f}")
        shared = r.get("homeai-shared")
        for policy in ("homeai", "homeai-public"):
            if shared and r.get(policy) and scenario["shape"]["members"] > 1:
                lines.append(f"{name}: {policy} / homeai-shared, TTFT p50 turn 1 "
                             f"{_ratio(r[policy], shared, 'turn1_ttft_ms')}, later turns "
                             f"{_ratio(r[policy], shared, 'later_ttft_ms')}; prompt tokens cached "
                             f"{r[policy]['hit_rate']} vs {shared['hit_rate']}")
    return lines


def _ratio(a: dict, b: dict, key: str) -> str:
    x, y = a[key]["p50"], b[key]["p50"]
    return f"{x / y:.2f}x" if x and y else "n/a"


def markdown(doc: dict, command: str, machine: str) -> str:
    lines = ["# homeai bench: multiturn", "", f"Command: `{command}`", "", f"Machine: {machine}", ""]
    for name, scenario in doc["scenarios"].items():
        s = scenario["shape"]
        lines += [f"## {name}", "",
                  f"{s['members']} members x {s['turns']} turns, system prompt {s['system_len']} tokens, "
                  f"{s['user_len']} new tokens a turn, answers of {s['output_len']}, think time {s['think_s']} s, "
                  f"background {'saturated' if s['background'] else 'idle'}.", "",
                  "| policy | turn-1 TTFT p50 / p95 ms | later turns TTFT p50 / p95 ms | later / turn 1 (p50) | "
                  "prompt tokens cached (later turns) |", "|---|---|---|---:|---:|"]
        for policy, r in scenario["policies"].items():
            f, later = r["turn1_ttft_ms"], r["later_ttft_ms"]
            lines.append(f"| {policy} | {f['p50']} / {f['p95']} | {later['p50']} / {later['p95']} | "
                         f"{r['later_over_turn1_p50']} | {r['hit_rate']} ({r['later_hit_rate']}) |")
        lines.append("")
    lines += ["## Findings", ""] + [f"* {line}" for line in doc.get("findings", [])]
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path, command: str, machine: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "command": command, "machine": machine}
    (out / "multiturn.json").write_text(json.dumps(doc, indent=2))
    (out / "multiturn.md").write_text(markdown(doc, command, machine))
