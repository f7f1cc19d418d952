"""The scheduler's fixed cost per step: schedule() + update() with a few sequences decoding, nothing waiting.

    PYTHONPATH=. .venv/bin/python scripts/sched_step_cost.py [--seqs 1,4,16] [--lanes summaries,chat]
                                                          [--steps 1500] [--reps 5] [--profile LANE:N]
                                                          [--planning] [--cached N] [--plan-ahead]

No model: the runner is a fake that samples token 7 for every row. Each case admits N requests
of one lane (a background lane, as `homeai bench engine` uses, or an interactive one), reads
their prompts, then times `steps` steps of steady decoding: every step one token a sequence,
as the engine's steady state at N sequences. The limits are the engine's defaults with the
two caches of a GPU's context (65,536 cells, 32,768 for the interactive lanes: sixteen sequences
decode 1,500 steps without filling them (16 x 2,048), so no step preempts; 32 sequence ids; n_batch 512; the
prompt cache on: `--cached N` leaves N earlier one-token answers' prefixes in it first, as the
engine has after a few answers, each looked at by the cache's expiry every step). Prints the median over `reps` of
the mean milliseconds per step (wall clock, perf_counter), and with `--planning` the medians
of `homeai.bench.engine_bench.planning_cost()` (256 waiting, 64 running). `--profile chat:1`
prints a cProfile of that case instead. `--plan-ahead` runs the steps as the engine does when it
plans each step while the one before computes (`ahead()`, `schedule()`, `settle()`), and says
how much of the step comes after its samples (`settle()`, `prune()`): on a GPU, the rest is done
while it computes.

Wall time on a shared box moves 10-50% from minute to minute; instructions do not. To compare two
checkouts exactly, count the instructions of a case's steps alone (valgrind's callgrind, counting
switched on around the steps only), in each checkout, and divide by the steps:

    PYTHONPATH=. valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
        .venv/bin/python scripts/sched_step_cost.py --callgrind chat:1 --steps 300 [--cached 16]

`--callgrind planning` counts the steps of `planning_cost`'s full house instead (256 waiting, 64
running; the fake runner's results included).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import subprocess
import time

from homeai.sched.request import Request, Sample, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits, StepResult
from lanes import DEFAULT_POLICIES

LIMITS = SchedulerLimits(num_cells=65536, num_seqs=32, max_step_tokens=512, embed_max_tokens=2048,
                         embed_max_seqs=64, interactive_cells=32768, prompt_cache=True)


SEVEN = Sample(7)  # every row samples token 7 (a sample is immutable: one serves them all)


def _fake(plan) -> StepResult:
    return StepResult(samples={i.request_id: SEVEN for i in plan.generating if i.sample}, elapsed_ms=1.0)


def steady(lane: str, num_running: int, num_cached: int = 0) -> tuple[Scheduler, float]:
    """A scheduler with `num_running` sequences of `lane` decoding, and its clock; `num_cached`
    earlier requests' prefixes in the prompt cache (as the engine has after a few answers)."""
    sched = Scheduler(dict(DEFAULT_POLICIES), LIMITS)
    now = 1.0
    for i in range(num_cached):  # one-token answers to distinct prompts: each leaves an entry
        prompt = [(i * 71 + k) % 1000 + 1010 for k in range(40)]
        sched.add_request(Request(f"c{i}", lane, f"m{i % 3}", prompt, 0.0, params=SamplingParams(max_tokens=1)))
    while sched.requests:
        plan = sched.schedule(now)
        sched.update(plan, _fake(plan), now)
        now += 0.001
    for i in range(num_running):
        prompt = [(i * 131 + k) % 1000 + 10 for k in range(40)]
        sched.add_request(Request(f"r{i}", lane, f"m{i % 3}", prompt, 0.0,
                                  params=SamplingParams(temperature=0, max_tokens=1_000_000, ignore_eos=True)))
    for _ in range(50):  # past every window, all prompts read, every sequence decoding
        plan = sched.schedule(now)
        sched.update(plan, _fake(plan), now)
        now += 0.001
    assert len(sched.running) == num_running and all(r.is_decoding for r in sched.running), "not steady"
    assert sum(len(c) for c in sched.pools.cache.values()) == num_cached, "an entry went"
    return sched, now


def run_steps(sched: Scheduler, now: float, steps: int) -> float:
    for _ in range(steps):
        plan = sched.schedule(now)
        sched.update(plan, _fake(plan), now)
        now += 0.001
    return now


AFTER_SAMPLES = [0.0]  # seconds the ahead steps spent after their samples (settle, prune): what a GPU waits for


def run_steps_ahead(sched: Scheduler, now: float, steps: int) -> float:
    """`run_steps` as the engine does them planning ahead (`scheduler.plan_ahead`): the step
    settled in two halves, the next planned between them (while a GPU computes); the time spent
    after the samples, until the next step could launch, is added to AFTER_SAMPLES."""
    plan = sched.schedule(now)
    after_samples = 0.0
    for _ in range(steps):
        pending = sched.ahead(plan, now)
        after = sched.schedule(now) if sched.only_decoding() else None
        result = _fake(plan)
        start = time.perf_counter()
        sched.settle(plan, pending, result, now, after)
        if after is not None:
            sched.prune(after)
            if any(sched.waiting.values()):
                after = sched.replan(after, now)
        after_samples += time.perf_counter() - start
        plan = after if after is not None else sched.schedule(now)
        now += 0.001
    AFTER_SAMPLES[0] += after_samples
    return now


def ms_per_step(lane: str, num_running: int, steps: int, num_cached: int = 0, ahead: bool = False) -> float:
    sched, now = steady(lane, num_running, num_cached)
    start = time.perf_counter()
    (run_steps_ahead if ahead else run_steps)(sched, now, steps)
    elapsed = time.perf_counter() - start
    assert len(sched.running) == num_running and not any(r.num_preemptions for r in sched.running), "not steady"
    return elapsed / steps * 1000


def _instrument(on_off: str) -> None:
    """Turn callgrind's counting on or off for this process (nothing when not under callgrind)."""
    subprocess.run(["callgrind_control", "-i", on_off, str(os.getpid())], capture_output=True, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="1,4,16")
    ap.add_argument("--lanes", default="summaries,chat")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", help="LANE:N: print a cProfile of that case")
    ap.add_argument("--planning", action="store_true", help="also planning_cost() (256 waiting, 64 running)")
    ap.add_argument("--cached", type=int, default=0, help="earlier requests' prefixes in the prompt cache")
    ap.add_argument("--callgrind", help="LANE:N or planning: under callgrind, count that case's steps alone (see above)")
    ap.add_argument("--plan-ahead", action="store_true", help="the steps as the engine runs them planning ahead")
    args = ap.parse_args()
    if args.callgrind == "planning":  # the full house of `planning_cost`, its fake runner's results made between
        from homeai.bench.engine_bench import fake_result, full_house
        sched, now = full_house()
        _instrument("on")
        for _ in range(args.steps):
            plan = sched.schedule(now)
            sched.update(plan, fake_result(plan), now)
            now += 0.01
        _instrument("off")
        print(f"{args.steps} steps: divide the I refs callgrind reports by {args.steps}")
        return
    if args.callgrind:
        lane, n = args.callgrind.split(":")
        sched, now = steady(lane, int(n), args.cached)
        _instrument("on")
        (run_steps_ahead if args.plan_ahead else run_steps)(sched, now, args.steps)
        _instrument("off")
        print(f"{args.steps} steps: divide the I refs callgrind reports by {args.steps}")
        return
    if args.profile:
        lane, n = args.profile.split(":")
        sched, now = steady(lane, int(n), args.cached)
        prof = cProfile.Profile()
        prof.runcall(run_steps, sched, now, args.steps)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    for lane in args.lanes.split(","):
        for n in map(int, args.seqs.split(",")):
            AFTER_SAMPLES[0] = 0.0
            runs = [ms_per_step(lane, n, args.steps, args.cached, args.plan_ahead) for _ in range(args.reps)]
            after = f", {AFTER_SAMPLES[0] / (args.steps * args.reps) * 1000:.4f} of it after the samples" if args.plan_ahead else ""
            print(f"{lane:10s} {n:3d} running: {statistics.median(runs):.4f} ms/step{after} "
                  f"(runs {', '.join(f'{r:.4f}' for r in runs)})")
    if args.planning:
        from homeai.bench.engine_bench import planning_cost
        runs = [planning_cost()["ms_per_step"] for _ in range(args.reps)]
        print(f"planning 256 waiting, 64 running: {statistics.median(runs):.3f} ms/step "
              f"(runs {', '.join(f'{r:.3f}' for r in runs)})")


if __name__ == "__main__":
    main()
