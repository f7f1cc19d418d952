"""`homeai bench spec`: drafted tokens (`[speculative]`) off and on, in one run, on one engine.

Three workloads, each run with drafting off and on in turn (`--reps` times, medians reported):
- one talker on a Home Assistant tool-call answer (its system prompt lists the exposed devices, as
  Home Assistant's does; the answer names one of them and a tool);
- one talker on a summary that quotes its document;
- the household mix: a voice and a chat talker, each asking on a fixed schedule (the same questions
  in both phases), beside the background lanes kept saturated (summaries of long documents).
The talkers answer greedily, so each rep's answer with drafting on is compared token for token with its
answer without (`greedy_identical`: every rep; llama.cpp's batch noise may part them at a near tie,
which the tests check as distributions). `speedup` is the one-talker tokens/s ratio, each answer's
first token to its last (on over off, medians, the smaller of the two workloads), `background_ratio` the background's tokens/s in the mix (on over off), and
`itl_p95_ratio` the talkers' p95 time between tokens as their client sees them (tokens that come in
one step come together: a drafted step's gap is longer, and the tokens after it come at once), and
`tpot_p95_ratio` the p95 over their answers of each one's time a token, first to last. The engine's drafting is switched between phases (the same engine, cost model
and thread: `Drafting.settings`), and the acceptance it learnt carries over, as it would on a box.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from homeai.bench.assistant_bench import TOOLS, system_prompt
from homeai.engine.stream import FinishEvent, TokenEvent
from homeai.sched.draft import DraftSettings
from homeai.sched.request import SamplingParams

NOTICE = ("Notice to residents. The council will close Mill Lane between the bridge and the primary school from "
          "Monday 4 March to Monday 18 March while the water main under the road is replaced. Buses 12 and 14 will "
          "use Station Road and Church Street instead, and the stop outside the library will move to the corner of "
          "Church Street. Cars parked on Mill Lane must be moved by Sunday evening. The school stays open, and its "
          "gate on Orchard Close will be used for the two weeks. Residents can ask questions at the library on "
          "Wednesday 6 March from six to eight in the evening.")
DOCUMENT = " ".join(f"Section {i}. " + NOTICE for i in range(1, 5))  # a background summary's document


@dataclass(frozen=True)
class Shape:
    reps: int = 3  # off and on, in turn, per one-talker workload
    answer_tokens: int = 96  # each one-talker answer's cap
    mix_s: float = 25.0  # seconds of each household-mix phase
    ask_every_s: float = 5.0  # each talker of the mix asks on this schedule (or at once, when behind)
    devices: int = 24


QUICK = Shape(reps=1, answer_tokens=32, mix_s=6.0, ask_every_s=2.0, devices=8)


def one_talker_prompts(runner, shape: Shape) -> dict[str, list[int]]:
    tool_call = [{"role": "system", "content": system_prompt(shape.devices, datetime(2026, 12, 6, 8, 30))},
                 {"role": "user", "content": "Turn on the Kitchen Ceiling Light"}]
    summary = [{"role": "user", "content": f"Here is a notice:\n\n{NOTICE}\n\nCopy the notice."}]
    return {"tool_call": list(runner.tokenize(runner.apply_chat_template(tool_call, TOOLS))),
            "summary": list(runner.tokenize(runner.apply_chat_template(summary)))}


def _switch(engine, on: bool, max_draft: int) -> None:
    with engine.lock:
        drafting = engine.scheduler.drafting
        drafting.settings = replace(drafting.settings, enabled=on, max_draft=max_draft)


def _answer(engine, tokens: list[int], lane: str, member: str, max_tokens: int,
            seen=None) -> tuple[list[int], list[float]]:
    """A greedy answer, its tokens and each token's arrival time (each also handed to `seen` as it comes)."""
    out, times = [], []
    for event in engine.submit(list(tokens), lane=lane, member=member,
                               params=SamplingParams(temperature=0, max_tokens=max_tokens)):
        if isinstance(event, TokenEvent):
            out.append(event.token)
            times.append(time.perf_counter())
            if seen is not None:
                seen(times)
        elif isinstance(event, FinishEvent) and event.reason not in ("stop", "length"):
            raise RuntimeError(f"an answer ended {event.reason}: {event.error}")
    return out, times


def one_talker(engine, tokens: list[int], shape: Shape, max_draft: int, progress=print) -> dict:
    """Off and on in turn: tokens/s of one answer (its first token to its last: the prompt is read alike
    either way), and whether each rep's two answers are the same tokens."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    same, lengths = [], []
    for rep in range(shape.reps):
        answers = {}
        for on in (False, True):
            _switch(engine, on, max_draft)
            out, times = _answer(engine, tokens, "chat", "talker", shape.answer_tokens)
            elapsed = times[-1] - times[0] if len(times) > 1 else 0.0
            rates[on].append((len(out) - 1) / elapsed if elapsed > 0 else 0.0)
            answers[on] = out
            progress(f"    rep {rep + 1} drafting {'on ' if on else 'off'}: {len(out)} tokens, {rates[on][-1]:.1f} tok/s")
        same.append(answers[False] == answers[True])
        lengths.append(len(answers[True]))
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    return {"off_tok_s": round(off, 2), "on_tok_s": round(on, 2), "speedup": round(on / off, 3) if off else None,
            "greedy_identical": all(same), "identical_reps": sum(same), "tokens": lengths,
            "off_each": [round(r, 2) for r in rates[False]], "on_each": [round(r, 2) for r in rates[True]]}


def household_mix(engine, runner, shape: Shape, on: bool, max_draft: int) -> dict:
    """A voice and a chat talker asking every `shape.ask_every_s`, beside two background summaries kept
    in flight, for `shape.mix_s` seconds: the background's tokens/s and the talkers' gaps between tokens."""
    _switch(engine, on, max_draft)
    talker_prompts, document = _mix_prompts(runner, shape)
    stop = threading.Event()
    gaps: list[float] = []
    per_token: list[float] = []  # each whole answer's time a token
    talked = [0]
    lock = threading.Lock()

    def talker(lane: str, tokens: list[int]) -> None:
        """Asks on a fixed schedule, drafting or not, so both phases put the same questions beside the background."""
        def seen(times: list[float]) -> None:  # each gap as it comes: an answer the phase cuts short counts too
            with lock:
                talked[0] += 1
                if len(times) > 1 and not stop.is_set():
                    gaps.append(times[-1] - times[-2])

        asked = time.perf_counter()
        while not stop.is_set():
            out, times = _answer(engine, tokens, lane, f"{lane}-talker", shape.answer_tokens, seen)
            with lock:
                if len(times) > 1 and not stop.is_set():  # its time a token, first to last (TPOT)
                    per_token.append((times[-1] - times[0]) / (len(times) - 1))
            asked += shape.ask_every_s
            stop.wait(max(asked - time.perf_counter(), 0.0))

    background_done = [0]

    def background(n: int) -> None:
        while not stop.is_set():
            stream = engine.submit(list(document), lane="summaries", member=f"indexer{n}",
                                   params=SamplingParams(temperature=0, max_tokens=64))
            for event in stream:
                if isinstance(event, FinishEvent):
                    with lock:  # what it computed: its prompt (less what it found cached) and its answer
                        background_done[0] += (event.stats.prompt_tokens - event.stats.cached_tokens
                                               + event.stats.output_tokens)
    threads = [threading.Thread(target=background, args=(n,), daemon=True) for n in range(2)]
    threads += [threading.Thread(target=talker, args=("voice", talker_prompts["tool_call"]), daemon=True),
                threading.Thread(target=talker, args=("chat", talker_prompts["summary"]), daemon=True)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(shape.mix_s)
    deadline = time.perf_counter() + 20 * shape.mix_s  # on a loaded box: until each talker answered once
    while time.perf_counter() < deadline:
        with lock:
            if len(per_token) >= 2:
                break
        time.sleep(0.05)
    with engine.lock:  # what the background computed so far, finished or not
        running = sum(max(r.num_computed_tokens - r.num_cached_tokens, 0) for r in engine.scheduler.running
                      if not r.interactive) + background_done[0]
        elapsed = time.perf_counter() - began
        with lock:
            talker_tokens, itl, tpot = talked[0], sorted(gaps), sorted(per_token)
    stop.set()
    for t in threads:
        t.join(300)
    return {"background_tok_s": round(running / elapsed, 2), "talker_tokens": talker_tokens,
            "itl_p95_ms": _p95_ms(itl), "tpot_p95_ms": _p95_ms(tpot), "answers": len(tpot)}


def _p95_ms(values: list[float]) -> float | None:
    """The 95th percentile of sorted seconds, in ms (None: none)."""
    return round(values[min(int(0.95 * (len(values) - 1) + 0.5), len(values) - 1)] * 1000, 2) if values else None


def _mix_prompts(runner, shape: Shape) -> tuple[dict[str, list[int]], list[int]]:
    """The talkers' prompts, and the background's document to summarise."""
    document = list(runner.tokenize(runner.apply_chat_template(
        [{"role": "user", "content": f"Summarise this document in a few sentences.\n\n{DOCUMENT}"}])))
    return one_talker_prompts(runner, shape), document


def _warm(engine, runner, shape: Shape) -> None:
    """Each of the mix's prompts read once before either phase, by the members who send them, so neither
    phase reads them cold (the prompt cache keeps them as it would on a box that has been running)."""
    talkers, document = _mix_prompts(runner, shape)
    asks = [(talkers["tool_call"], "voice", "voice-talker"), (talkers["summary"], "chat", "chat-talker"),
            *((document, "summaries", f"indexer{n}") for n in range(2))]
    for tokens, lane, member in asks:
        _answer(engine, tokens, lane, member, 1)


def run(engine, runner, shape: Shape = Shape(), max_draft: int = 8, progress=print) -> dict:
    prompts = one_talker_prompts(runner, shape)
    report: dict = {"shape": shape.__dict__, "max_draft": max_draft, "model": runner.info.description}
    for name, tokens in prompts.items():
        progress(f"  one talker, {name} ({len(tokens)} prompt tokens)")
        report[name] = one_talker(engine, tokens, shape, max_draft, progress)
    progress("  household mix")
    _warm(engine, runner, shape)
    mix = {}
    for on in (False, True):
        mix[on] = household_mix(engine, runner, shape, on, max_draft)
        progress(f"    drafting {'on ' if on else 'off'}: background {mix[on]['background_tok_s']} tok/s, "
                 f"talkers' ITL p95 {mix[on]['itl_p95_ms']} ms")
    report["household"] = {"off": mix[False], "on": mix[True]}
    off, on = mix[False], mix[True]
    report["speedup"] = min(report["tool_call"]["speedup"] or 0.0, report["summary"]["speedup"] or 0.0)
    report["greedy_identical"] = report["tool_call"]["greedy_identical"] and report["summary"]["greedy_identical"]
    report["background_ratio"] = round(on["background_tok_s"] / off["background_tok_s"], 3) \
        if off["background_tok_s"] else None
    report["itl_p95_ratio"] = round(on["itl_p95_ms"] / off["itl_p95_ms"], 3) \
        if on["itl_p95_ms"] and off["itl_p95_ms"] else None
    report["tpot_p95_ratio"] = round(on["tpot_p95_ms"] / off["tpot_p95_ms"], 3) \
        if on["tpot_p95_ms"] and off["tpot_p95_ms"] else None
    with engine.lock:
        report["drafting"] = {f"{lane}/{member}": {"drafted": p.drafted, "accepted": p.accepted_total,
                                                   "rate_fresh": round(p.rate(False), 3),
                                                   "rate_run": round(p.rate(True), 3)}
                              for (lane, member), p in engine.scheduler.drafting.pairs.items()}
    return report


def markdown(report: dict, command: str) -> str:
    rows = [f"# `{command}`", "", f"Model: {report['model']}; up to {report['max_draft']} drafted tokens a step.", "",
            "| workload | off tok/s | on tok/s | speedup | greedy answers identical |", "|---|---:|---:|---:|---|"]
    for name in ("tool_call", "summary"):
        r = report[name]
        rows.append(f"| one talker, {name.replace('_', ' ')} | {r['off_tok_s']} | {r['on_tok_s']} | {r['speedup']} | "
                    f"{r['identical_reps']} of {len(r['off_each'])} reps |")
    off, on = report["household"]["off"], report["household"]["on"]
    rows += ["", "| household mix | off | on | ratio |", "|---|---:|---:|---:|",
             f"| background tok/s | {off['background_tok_s']} | {on['background_tok_s']} | {report['background_ratio']} |",
             f"| talkers' ITL p95 ms (each gap between tokens) | {off['itl_p95_ms']} | {on['itl_p95_ms']} | "
             f"{report['itl_p95_ratio']} |",
             f"| talkers' time a token p95 ms (each answer, first token to last) | {off['tpot_p95_ms']} | "
             f"{on['tpot_p95_ms']} | {report['tpot_p95_ratio']} |", ""]
    return "\n".join(rows)


def write(report: dict, out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps({**report, "command": command}, indent=2))
    (out / "spec.md").write_text(markdown(report, command))


def main(cfg, args) -> int:
    import sys
    from homeai.app import engine_over, load_runner

    if args.max_draft is not None and not 1 <= args.max_draft <= 32:
        print("homeai: --max-draft must be 1..32", file=sys.stderr)
        return 2
    shape = QUICK if args.quick else Shape(reps=args.reps)
    runner = load_runner(cfg, embeddings=False, grammar=False)
    engine = engine_over(cfg, runner).start()
    try:
        if not engine.scheduler.drafting.settings.lanes:  # (the scheduler leaves none to such a model)
            print("homeai: this model's cache cannot be cut back to accepted guesses (a sliding window or a "
                  "recurrent state): it drafts nothing", file=sys.stderr)
            return 2
        report = run(engine, runner, shape, max_draft=args.max_draft or cfg.speculative.max_draft)
    finally:
        engine.stop()
        runner.close()
    command = " ".join(["homeai", *sys.argv[1:]])
    write(report, Path(args.out), command)
    print(markdown(report, command))
    return 0
