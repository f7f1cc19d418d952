"""The report of `homeai bench members` (`members_bench`): bob's and carol's figures per phase,
the verdicts against the targets of issues 26 and 55, and members.json / members.md.

Targets: beside a flood or an issue 55 load, bob's TTFT p95 and carol's first audio p95 each
<= `TARGET_P95_MS` and <= `TARGET_FLOOD_RATIO`x their idle p95; beside requests refused as they
should be, bob unchanged beyond noise (`NO_CHANGE`), carol as beside a flood.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

from homeai.engine.stats import percentile

TARGET_P95_MS = 1000.0  # beside a flood: bob's TTFT p95 at most this...
TARGET_FLOOD_RATIO = 3.0  # ...and at most this many times his idle p95
NO_CHANGE = 1.5  # beside refused requests: p50 and p95 within this many times idle (this CPU's noise)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def bob_figures(samples: list) -> dict:
    ttfts = [s.ttft_ms for s in samples if s.ttft_ms is not None]
    return {"n": len(samples), "sent": sum(s.sent for s in samples), "answered": len(ttfts),
            "whole": sum(s.total_ms is not None for s in samples),
            "statuses": dict(collections.Counter(str(s.status) for s in samples)),
            "ttft_ms": {"p50": percentile(ttfts, 50), "p95": percentile(ttfts, 95), "max": max(ttfts, default=None)}}


def carol_figures(turns: list) -> dict:
    audio = [t.first_audio_ms for t in turns if t.first_audio_ms is not None]
    errors = list(dict.fromkeys(t.error for t in turns if t.error))[:3]
    return {"n": len(turns), "heard": len(audio), "errors": errors,
            "first_audio_ms": {"p50": percentile(audio, 50), "p95": percentile(audio, 95),
                               "max": max(audio, default=None)}}


def verdict(phase, bob: dict, idle: dict, flood: dict | None, carol: dict | None = None,
            carol_idle: dict | None = None) -> tuple[str, str]:
    """The phase's target in words, and "pass", "fail" or "no figure"; carol's first audio is
    judged beside bob's TTFT when she spoke (`carol`, against her idle `carol_idle`)."""
    p50, p95 = bob["ttft_ms"]["p50"], bob["ttft_ms"]["p95"]
    r50, r95 = _ratio(p50, idle["ttft_ms"]["p50"]), _ratio(p95, idle["ttft_ms"]["p95"])
    if phase.load == "none":
        return ("baseline" if phase.name == "idle" else "drift: none expected"), "-"
    everyone = bob["answered"] == bob["n"]
    if phase.expect != 200 and phase.expect is not None:
        refused = (bool(flood) and flood["requests"] > 0 and not flood.get("transport_errors")
                   and flood["statuses"] == {str(phase.expect): flood["requests"]})
        target = f"every request {phase.expect}; p50 and p95 <= {NO_CHANGE:g}x idle"
        ok = None if r50 is None or r95 is None else (everyone and refused and max(r50, r95) <= NO_CHANGE)
    else:
        target = f"p95 <= {TARGET_P95_MS:g} ms and <= {TARGET_FLOOD_RATIO:g}x idle p95"
        ok = None if r95 is None else (everyone and p95 <= TARGET_P95_MS and r95 <= TARGET_FLOOD_RATIO)
    if carol and carol["n"]:
        heard = carol["first_audio_ms"]["p95"]
        ratio = _ratio(heard, (carol_idle or {}).get("first_audio_ms", {}).get("p95"))
        target += f"; carol's first audio p95 <= {TARGET_P95_MS:g} ms and <= {TARGET_FLOOD_RATIO:g}x idle"
        carol_ok = None if ratio is None else (carol["heard"] == carol["n"] and heard <= TARGET_P95_MS
                                               and ratio <= TARGET_FLOOD_RATIO)
        ok = None if ok is None or carol_ok is None else ok and carol_ok
    return target, "no figure" if ok is None else ("pass" if ok else "fail")


def build_report(shape, phases_run, samples: list, floods: dict, *, model: str, machine: str = "",
                 turns: list = (), no_voice: str | None = None) -> dict:
    """The report of a run of `phases_run` (`members_bench.PHASES`) in `shape`."""
    idle = bob_figures([s for s in samples if s.phase == "idle"])
    carol_idle = carol_figures([t for t in turns if t.phase == "idle"])
    phases = {}
    for phase in phases_run:
        bob = bob_figures([s for s in samples if s.phase == phase.name])
        carol = carol_figures([t for t in turns if t.phase == phase.name]) if no_voice is None else None
        target, result = verdict(phase, bob, idle, floods.get(phase.name), carol, carol_idle)
        phases[phase.name] = {
            "bob": bob, "carol": carol, "flood": floods.get(phase.name),
            "p50_over_idle": _ratio(bob["ttft_ms"]["p50"], idle["ttft_ms"]["p50"]),
            "p95_over_idle": _ratio(bob["ttft_ms"]["p95"], idle["ttft_ms"]["p95"]),
            "carol_p95_over_idle": _ratio(carol["first_audio_ms"]["p95"], carol_idle["first_audio_ms"]["p95"])
            if carol else None,
            "target": target, "result": result}
    report = {"bench": "members", "model": model, "machine": machine, "shape": dataclasses.asdict(shape),
              "phases": phases, "carol": no_voice or "spoken turns, first audio timed",
              "samples": [dataclasses.asdict(s) for s in samples], "turns": [dataclasses.asdict(t) for t in turns]}
    report["findings"] = findings(report)
    return report


def findings(report: dict) -> list[str]:
    lines = []
    for name, p in report["phases"].items():
        ttft, flood = p["bob"]["ttft_ms"], p["flood"]
        beside = f" beside {flood['member']} ({flood['load']} on {flood['lane']}: {flood['statuses']})" if flood else ""
        carol = p["carol"]
        heard = (f"; carol's first audio p50 {carol['first_audio_ms']['p50']} ms, p95 {carol['first_audio_ms']['p95']} "
                 f"ms ({p['carol_p95_over_idle']}x idle p95, {carol['heard']}/{carol['n']} heard)") if carol else ""
        lines.append(f"{name}: bob's TTFT p50 {ttft['p50']} ms, p95 {ttft['p95']} ms ({p['p50_over_idle']}x / "
                     f"{p['p95_over_idle']}x idle){heard}{beside}; target {p['target']}: {p['result']}")
    return lines


def markdown(report: dict, command: str) -> str:
    s = report["shape"]
    rows = ["| phase | the other member | their requests (status: count) | their tokens/s | bob's chats answered "
            "| TTFT p50 / p95 (ms) | p50 / p95 over idle | carol's turns heard | first audio p50 / p95 (ms) "
            "| p95 over idle | target | result |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, p in report["phases"].items():
        f, b, c = p["flood"], p["bob"], p["carol"]
        who = f"{f['member']}: {_what(f)}" if f else "-"
        statuses = ", ".join(f"{k}: {v}" for k, v in f["statuses"].items()) if f else "-"
        heard = (f"{c['heard']}/{c['n']} | {c['first_audio_ms']['p50']} / {c['first_audio_ms']['p95']} | "
                 f"{p['carol_p95_over_idle']}") if c else "- | - | -"
        speed = f["tokens_per_s"] if f and f["tokens_per_s"] is not None else "-"
        rows.append(f"| {name} | {who} | {statuses} | {speed} | {b['answered']}/{b['n']} | "
                    f"{b['ttft_ms']['p50']} / {b['ttft_ms']['p95']} | {p['p50_over_idle']} / {p['p95_over_idle']} | "
                    f"{heard} | {p['target']} | {p['result']} |")
    errors = [f"* {name}: {error}" for name, p in report["phases"].items() if p["flood"]
              for error in p["flood"]["errors"]]
    carol_errors = [f"* {name}: {error}" for name, p in report["phases"].items() if p["carol"]
                    for error in p["carol"]["errors"]]
    text = ["# One member beside another", "", f"Command: `{command}`", "",
            f"Bob sends {s['samples']} streamed chats a phase ({s['bob_tokens']} tokens, "
            f"one after another), timed to the first content chunk, each given {s['timeout_s']:g} s and the phase "
            f"{s['phase_max_s']:g} s; a flood keeps {s['streams']} streams of {s['stream_tokens']} tokens in flight "
            f"(a finished one is sent again); a stream refused its lane is sent again after {s['retry_s']:g} s, a "
            f"refused grammar {s['grammar_pause_s']:g} s after its refusal ({s['grammar_senders']} at once). "
            f"Seed {s['seed']}.", "", f"Machine: {report['machine']}", "", *rows, "",
            "Their tokens/s: content chunks a second over the phase (tokens per finished stream: "
            f"{_per_stream(report)}); bob's ratios are against his idle phase of this run.", "",
            f"Carol: {report['carol']} (from `audio.end` to the answer's first audio frame, {s['carol_turns']} "
            f"a phase, answers of at most {s['carol_tokens']} tokens).", "",
            *(["What the refused requests were told:", "", *errors, ""] if errors else []),
            *(["What carol's turns without audio came to:", "", *carol_errors, ""] if carol_errors else []),
            *[f"* {line}" for line in report["findings"]], ""]
    return "\n".join(text)


def _per_stream(report: dict) -> str:
    return ", ".join(f"{name} {p['flood']['tokens_per_finished_stream'] or 'none finished'}"
                     for name, p in report["phases"].items()
                     if p["flood"] and p["flood"]["load"] == "streams" and p["flood"]["expected_status"] == 200)


def _what(flood: dict) -> str:
    n = flood["senders"]
    described = {"grammar": f"json_schemas too large to build, {n} at once",
                 "pattern": f"a nested-quantifier pattern behind a const, {n} at once",
                 "slow grammar": f"{n} slow grammars at once, each new",
                 "speech": f"{n} /v1/audio/speech streams on {flood['lane']}, read slowly",
                 "trickle": f"{n} sockets trickling a body, no token"}
    if flood["load"] in described:
        return described[flood["load"]]
    allowed = "" if flood["expected_status"] == 200 else ", a lane not allowed"
    return f"{flood['senders']} streams on {flood['lane']}{allowed}"


def write(report: dict, out: Path, command: str = "homeai bench members") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "members.json").write_text(json.dumps({**report, "command": command}, indent=2))
    (out / "members.md").write_text(markdown(report, command))
