"""Where one engine step's time goes: each phase timed on the engine thread, beside the raw loop.

    .venv/bin/python scripts/step_profile.py /tmp/tiny.gguf [--seqs 1,4,16] [--tokens 128] [--reps 3]

The model is loaded with one thread (`homeai bench model /tmp/tiny.gguf --shape tiny --type q4_0`
makes a random one whose token costs about an 8B model's on a GPU). Each repetition runs the
engine (a background lane, greedy, past end-of-generation, as `homeai bench engine` does) and the
raw loop of `homeai.bench.raw_loop` on the same prompts, and reports per step: wall time and the
engine thread's CPU time in each phase, the asyncio side's CPU time (the stream hand-off's other
half), and what the raw loop's step costs. Phases are inclusive (`run` holds `fill`, `decode`,
`sample`; `deliver` holds `piece`, `text`, `push`); `loop` is the rest of the engine thread's
step (lock, counters, clock). Medians over the repetitions; on a busy box compare the phases as
shares of one run, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path

from homeai.bench.engine_bench import _engine_run, _prompts
from homeai.bench.raw_loop import raw_batched_decode
from homeai.app import load_runner
from homeai.config import from_dict
from homeai.engine import engine as engine_mod
from homeai.llama import runner as runner_mod, sampling
from homeai.engine import text as text_mod
from homeai.engine.engine import create_engine
from homeai.sched import scheduler as sched_mod

PHASES = ["schedule", "run", "fill", "decode", "sample", "update", "deliver", "piece", "text", "push", "close", "wake"]


class Timers:
    """Per-phase wall and thread-CPU nanoseconds, counted only on the engine thread."""

    def __init__(self):
        self.wall = defaultdict(int)
        self.cpu = defaultdict(int)
        self.calls = defaultdict(int)
        self.thread = None

    def clear(self):
        self.wall.clear()
        self.cpu.clear()
        self.calls.clear()

    def wrap(self, owner, name: str, phase: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if threading.current_thread() is not self.thread:
                return fn(*args, **kwargs)
            w, c = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[phase] += time.perf_counter_ns() - w
                self.cpu[phase] += time.thread_time_ns() - c
                self.calls[phase] += 1

        setattr(owner, name, timed)


def instrument(timers: Timers, runner) -> None:
    timers.wrap(sched_mod.Scheduler, "schedule", "schedule")
    timers.wrap(sched_mod.Scheduler, "update", "update")
    timers.wrap(runner_mod.Runner, "run", "run")
    timers.wrap(type(runner.batch), "fill", "fill")
    timers.wrap(runner_mod.ll, "llama_decode", "decode")
    timers.wrap(sampling.Sampler, "sample", "sample")
    timers.wrap(engine_mod.Engine, "_deliver", "deliver")
    timers.wrap(runner_mod.Runner, "piece", "piece")
    timers.wrap(text_mod.TextStream, "add", "text")
    timers.wrap(engine_mod.RequestStream, "push", "push")
    timers.wrap(engine_mod.Engine, "_close", "close")
    timers.wrap(engine_mod, "wake_all", "wake")


def one(engine, timers: Timers, prompts, num_tokens: int) -> dict:
    """One engine run and one raw run on the same prompts: per-step figures (ms)."""
    timers.clear()
    steps0 = engine.counters["steps"]
    engine_cpu0 = _thread_cpu(engine._thread)
    main_cpu0 = time.thread_time_ns()
    ours = asyncio.run(_engine_run(engine, prompts, num_tokens))
    main_cpu = time.thread_time_ns() - main_cpu0
    engine_cpu = _thread_cpu(engine._thread) - engine_cpu0
    steps = engine.counters["steps"] - steps0
    row = {f"{p}_ms": timers.wall[p] / steps / 1e6 for p in PHASES}
    row.update({f"{p}_cpu_ms": timers.cpu[p] / steps / 1e6 for p in PHASES})
    raw = engine.call_in_loop(lambda r: _cpu_timed(_raw, engine, r, prompts, num_tokens))
    raw_steps = num_tokens  # one prefill decode (or a few) and num_tokens - 1 decodes
    row["step_ms"] = ours["seconds"] * 1000 / steps
    row["engine_cpu_ms"] = engine_cpu / steps / 1e6
    row["asyncio_cpu_ms"] = main_cpu / steps / 1e6
    top = ("schedule", "run", "update", "deliver", "close", "wake")
    row["loop_cpu_ms"] = row["engine_cpu_ms"] - sum(row[f"{p}_cpu_ms"] for p in top)
    row["raw_step_ms"] = raw["seconds"] * 1000 / raw_steps
    row["raw_cpu_ms"] = raw["cpu_ns"] / raw_steps / 1e6
    row["cpu_ratio"] = row["raw_cpu_ms"] / (row["engine_cpu_ms"] + row["asyncio_cpu_ms"])
    row["ratio"] = (ours["tokens"] / ours["seconds"]) / (raw["tokens"] / raw["seconds"])
    row["steps"] = steps
    return row


def _raw(engine, runner, prompts, num_tokens: int) -> dict:
    """The raw loop empties llama.cpp's cache: the engine's prompt cache forgets its prefixes first."""
    engine.scheduler.pools.drop_cached()
    return raw_batched_decode(runner, prompts, num_tokens)


def _cpu_timed(fn, *args) -> dict:
    start = time.thread_time_ns()
    out = fn(*args)
    return {**out, "cpu_ns": time.thread_time_ns() - start}


def _thread_cpu(thread) -> int:
    """A thread's CPU time (Linux: its clock id), in nanoseconds."""
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--seqs", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    cfg = from_dict({"model": {"path": str(args.model), "n_threads": args.threads, "n_ctx": 8192,
                               "interactive_n_ctx": 0, "n_seq_max": 32}})
    runner = load_runner(cfg, embeddings=False, grammar=False)
    engine = create_engine(cfg, runner).start()
    timers = Timers()
    timers.thread = engine._thread
    instrument(timers, runner)
    try:
        for n in [int(s) for s in args.seqs.split(",")]:
            prompts = _prompts(runner, n)
            one(engine, timers, prompts, 16)  # warm up
            rows = [one(engine, timers, prompts, args.tokens) for _ in range(args.reps)]
            print(report(n, rows), flush=True)
    finally:
        engine.stop()
        runner.close()


def report(n: int, rows: list[dict]) -> str:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    lines = [f"## {n} sequence(s): homeai/raw {med['ratio']:.2f} (runs: "
             + ", ".join(f"{r['ratio']:.2f}" for r in rows) + f"), {med['steps']:.0f} steps",
             f"step {med['step_ms']:.3f} ms wall, raw loop step {med['raw_step_ms']:.3f} ms,"
             f" overhead {med['step_ms'] - med['raw_step_ms']:.3f} ms",
             f"CPU: engine thread {med['engine_cpu_ms']:.3f} + asyncio {med['asyncio_cpu_ms']:.3f} ms/step,"
             f" raw loop {med['raw_cpu_ms']:.3f} ms/step: overhead"
             f" {med['engine_cpu_ms'] + med['asyncio_cpu_ms'] - med['raw_cpu_ms']:.3f} ms,"
             f" raw/homeai by CPU {med['cpu_ratio']:.2f}",
             "", "| phase | wall ms/step | engine-thread CPU ms/step |", "|---|---:|---:|"]
    for p in PHASES:
        lines.append(f"| {p} | {med[p + '_ms']:.3f} | {med[p + '_cpu_ms']:.3f} |")
    lines.append(f"| loop (rest of the engine thread) | | {med['loop_cpu_ms']:.3f} |")
    lines.append(f"| engine thread, all | | {med['engine_cpu_ms']:.3f} |")
    lines.append(f"| asyncio side (main thread) | | {med['asyncio_cpu_ms']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
