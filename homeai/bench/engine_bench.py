"""`homeai bench engine`: decode throughput of the engine beside a raw low-level loop, and planning cost.

Run: `homeai bench engine [--seqs 1,4,8,16] [--tokens 64] [--rounds 3]`. Both sides decode the same prompts
on the same loaded model in the same run, greedy, past end-of-generation, so the ratio measures
what the scheduler, the engine thread and the streams cost; the overhead is that cost per step
(the engine's seconds less the raw loop's, over the tokens each sequence decodes), in
milliseconds, printed beside the raw loop's own milliseconds a step: the same overhead is a larger
share of a faster box's step, so the ratio alone does not say whether a box or the code changed.
The engine's seconds start at its first admission, after the lane's batching window.
Each row alternates the two `--rounds` times and reports medians (and each round's ratio); the
planning cost is timed once before each round, and its median reported: single runs on a shared
box spread too far to compare, and the box's pace swings within a run. The engine side runs on a
background lane, which takes every sequence at once as the raw loop does (an interactive lane
admits only as many as keep their reading pace).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from homeai.bench.raw_loop import raw_batched_decode
from homeai.bench.suite import PROFILES
from homeai.engine.engine import Engine
from homeai.llama import Runner
from homeai.sched.request import Request, Sample, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits, StepResult
from lanes import DEFAULT_POLICIES

QUESTIONS = ["Tell me a story about a dragon.", "What is the weather like on Mars?",
             "Explain photosynthesis.", "Write a limerick about cheese."]


def _prompts(runner: Runner, n: int) -> list[list[int]]:
    texts = [QUESTIONS[i % len(QUESTIONS)] + f" (#{i})" for i in range(n)]
    return [runner.tokenize(runner.apply_chat_template([{"role": "user", "content": t}])) for t in texts]


async def _engine_run(engine: Engine, prompts: list[list[int]], num_tokens: int) -> dict:
    """The engine's seconds from its first admission to the last answer: a background lane waits up
    to its batching window (summaries: 50 ms) for a batch to fill before it admits, a wait by design
    that is not a step's overhead (it was ~0.4 ms a step of a 128-token run at 1 and 4 sequences)."""
    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    start = time.perf_counter()
    texts = await asyncio.gather(*[engine.generate(p, lane="summaries", params=params) for p in prompts])
    elapsed = time.perf_counter() - start
    window = min(f.stats.queue_ms or 0.0 for _, f in texts) / 1000.0
    return {"seconds": elapsed - window, "window_s": window, "tokens": sum(f.stats.output_tokens for _, f in texts)}


def engine_throughput(engine: Engine, seqs: list[int], num_tokens: int, progress=None, rounds: int = 1,
                      between=None) -> list[dict]:
    """A row per sequence count: the engine and the raw loop, alternating, `rounds` times; the
    medians (a shared box's noise moves single runs by +-0.1 of the ratio at one sequence).
    `between()` runs before each round (the planning cost, sampled over the whole run)."""
    rows = []
    for n in seqs:
        prompts = _prompts(engine.runner, n)
        runs = []
        for _ in range(rounds):
            if between:
                between()
            ours = asyncio.run(_engine_run(engine, prompts, num_tokens))
            raw = engine.call_in_loop(lambda runner: _raw_between_steps(engine, runner, prompts, num_tokens))
            runs.append({"homeai_tok_s": ours["tokens"] / ours["seconds"], "raw_tok_s": raw["tokens"] / raw["seconds"],
                         "ratio": (ours["tokens"] / ours["seconds"]) / (raw["tokens"] / raw["seconds"]),
                         "overhead_ms": (ours["seconds"] - raw["seconds"]) / num_tokens * 1000,
                         "raw_step_ms": raw["seconds"] / num_tokens * 1000})
        rows.append({"seqs": n, **{k: statistics.median(r[k] for r in runs) for k in runs[0]},
                     "ratios": [r["ratio"] for r in runs]})
        if progress:
            progress(rows[-1])
    return rows


def _raw_between_steps(engine: Engine, runner: Runner, prompts: list[list[int]], num_tokens: int) -> dict:
    """The raw loop on the engine thread. It empties llama.cpp's cache, so the engine's prompt cache
    forgets its prefixes first: else the next row's engine side reads cells that are gone (garbage
    text, and no prefill counted), and every row starts from an empty cache on both sides."""
    engine.scheduler.pools.drop_cached()
    return raw_batched_decode(runner, prompts, num_tokens)


def planning_cost(num_waiting: int = 256, num_running: int = 64, steps: int = 200, prompt_cache: bool = True) -> dict:
    """Mean schedule()+update() time with a full house (`full_house`), no model."""
    sched, now = full_house(num_waiting, num_running, prompt_cache)
    spent = 0.0  # in schedule() and update() alone: the fake runner's results are made between them
    clock = time.perf_counter
    for _ in range(steps):
        start = clock()
        plan = sched.schedule(now)
        spent += clock() - start
        result = fake_result(plan)
        start = clock()
        sched.update(plan, result, now)
        spent += clock() - start
        now += 0.01
    per_step = spent / steps
    return {"waiting": sum(len(q) for q in sched.waiting.values()), "running": len(sched.running),
            "ms_per_step": per_step * 1000}


_SEVEN = Sample(7)  # every row samples token 7 (a sample is immutable: one serves them all)


def full_house(num_waiting: int = 256, num_running: int = 64, prompt_cache: bool = True) -> tuple[Scheduler, float]:
    """A scheduler with `num_running` sequences decoding (every sequence id taken) and `num_waiting`
    requests waiting, of three lanes and seven members, and its clock; steps are run with fake
    samples, each taking what the consumer-GPU profile says (where planning time matters most next
    to a step's). The prompts share prefixes in 50 groups, so with the prompt cache admission
    finds matches."""
    limits = SchedulerLimits(num_cells=65536, num_seqs=num_running, max_step_tokens=512,
                             embed_max_tokens=2048, embed_max_seqs=64, prompt_cache=prompt_cache)
    policies = {k: p.__class__(**{**p.__dict__, "max_queue": 10_000}) for k, p in DEFAULT_POLICIES.items()}
    sched = Scheduler(policies, limits)
    lanes = ["chat", "voice", "summaries"]
    for i in range(num_running + num_waiting):
        lane = lanes[i % 3]
        sched.add_request(Request(f"r{i}", lane, f"m{i % 7}", [1 + (i % 50)] * 64, 0.0,
                                  params=SamplingParams(max_tokens=100_000)))
    now = 1.0
    for _ in range(20):  # warm up until the running set is full and decoding
        plan = sched.schedule(now)
        sched.update(plan, fake_result(plan), now)
        now += 0.01
    return sched, now


def fake_result(plan) -> StepResult:
    ms = sum(c * x for c, x in zip(PROFILES["gpu-consumer-8b"], plan.shape))
    return StepResult(samples={i.request_id: _SEVEN for i in plan.generating if i.sample}, elapsed_ms=ms)


def report(rows: list[dict], plan_cost: dict) -> str:
    lines = ["| sequences | homeai tok/s | raw loop tok/s | homeai / raw | overhead ms/step | raw loop ms/step"
             " | each round's ratio |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {r['seqs']} | {r['homeai_tok_s']:.1f} | {r['raw_tok_s']:.1f} | {r['ratio']:.2f} | {r['overhead_ms']:.3f}"
              f" | {r['raw_step_ms']:.3f} | {' '.join(f'{x:.2f}' for x in r['ratios'])} |" for r in rows]
    lines.append("")
    lines.append(f"scheduler planning: {plan_cost['ms_per_step']:.3f} ms per step with "
                 f"{plan_cost['waiting']} waiting and {plan_cost['running']} running")
    return "\n".join(lines)
