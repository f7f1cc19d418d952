"""The scheduler's behaviour written out exactly, to compare two checkouts: random workloads, no model.

    PYTHONPATH=TREE .venv/bin/python scripts/sched_trace.py OUT [SEEDS]     (SEEDS: 0-40 by default)

Each seed is a workload: random limits (one cache or two, the prompt cache on or off, shared or per
member, chunked embeddings or not, small caches that preempt), requests of every lane and several
members arriving at random (seeds from 100 on arrive about three times as often; from 200 on, some
are queued after requests that arrived later, and the benchmark's baseline policies take turns
with homeai's, `homeai/bench/policies.py`; from 300 on, a full house: the generating lanes alone, few
sequence ids and long answers, so requests wait for an id while every one is taken; homeai's policy),
aborts, stop strings found outside, held background, steps that find no KV slot or raise, and step
times from a random cost. Every plan (items, tokens, cache operations, budget, shape, what background is owed),
every output, and after each step the cost model's coefficients, background's credit, fair share's
counters and the typical output lengths are written with `repr`, so two checkouts that schedule
alike write the same bytes: run it on both (`git worktree add`) and `cmp` the files. A refactor of
the scheduler that is meant to keep its behaviour should keep them identical (issue 30's did).
"""
import hashlib
import random
import sys

from homeai.sched.request import Kind, Request, Sample, SamplingParams
from homeai.sched.scheduler import NoRoom, QueueFull, Scheduler, SchedulerLimits, StepResult
from homeai.bench.policies import make_scheduler
from lanes import DEFAULT_POLICIES

LANES = list(DEFAULT_POLICIES)
GENERATING = ["voice", "chat", "summaries"]  # a full house's lanes (seeds from 300)


def plan_repr(plan):
    parts = [f"step {plan.step_id} budget {plan.budget} cells {plan.context_cells} shape {tuple(plan.shape)!r}"]
    for pool, items in plan.batches.items():
        for i in items:
            h = hashlib.md5(repr(i.tokens).encode()).hexdigest()[:8]
            parts.append(f" {pool.value} {i.request_id} seq{i.seq_id} @{i.start} n{len(i.tokens)} {h} "
                         f"s{int(i.sample)} f{i.forced}")
    for pool, ops in plan.cache_ops.items():
        parts.append(f" ops {pool.value} {ops!r}")
    parts.append(f" done {plan.done!r} bg {plan.background!r}")
    return "\n".join(parts)


def scenario(seed, out):
    rng = random.Random(seed)
    full = seed >= 300  # every sequence id taken while requests wait, most steps
    two = rng.random() < 0.5
    limits = SchedulerLimits(num_cells=rng.choice([512, 1024, 4096]),
                             num_seqs=rng.choice([2, 3, 4, 6] if full else [4, 8, 16, 32]),
                             max_step_tokens=rng.choice([64, 128, 512]), embed_max_tokens=rng.choice([256, 512]),
                             embed_max_seqs=rng.choice([4, 16]), min_chunk=rng.choice([8, 16]),
                             interactive_cells=rng.choice([512, 1024]) if two else 0,
                             prompt_cache=rng.random() < 0.6, prompt_cache_max_cells=rng.choice([0, 0, 300]),
                             prompt_cache_shared=rng.random() < 0.3, embed_chunked=rng.random() < 0.7,
                             member_seq_share=rng.choice([0.5, 0.34]), max_seq_len=rng.choice([0, 0, 900]))
    policy = rng.choice(["homeai"] * 3 + ["fifo", "static", "serial"]) if 200 <= seed < 300 else "homeai"
    sched = make_scheduler(policy, dict(DEFAULT_POLICIES), limits) if policy != "homeai" else \
        Scheduler(dict(DEFAULT_POLICIES), limits)
    late = 0.3 if seed >= 200 else 0.0  # how often a request is queued after one that arrived later
    out.write(f"== seed {seed} {policy} {limits!r}\n")
    members = [f"m{i}" for i in range(rng.randint(1, 5))]
    prefixes = [[rng.randint(10, 60) for _ in range(rng.randint(8, 80))] for _ in range(4)]
    now = 0.0
    n = 0
    ids = []
    coef = (rng.uniform(2, 30), rng.uniform(0.1, 3), rng.uniform(0, 1), rng.uniform(0, 1))
    for step in range(rng.randint(150, 400)):
        if rng.random() < (0.35 if seed < 100 else 0.9):
            for _ in range(rng.choice([1, 1, 1, 2, 5])):
                lane = rng.choice(GENERATING if full else LANES)
                embed = lane == "embeddings" or (lane == "indexing" and rng.random() < 0.5)
                kind = Kind.EMBED if embed else Kind.GENERATE
                prompt = (rng.choice(prefixes) if rng.random() < 0.6 else []) + \
                    [rng.randint(10, 900) for _ in range(rng.choice([1, 5, 20, 60, 200, 700]))]
                forced = tuple(rng.randint(3, 99) for _ in range(rng.randint(1, 6))) if rng.random() < 0.05 else None
                params = SamplingParams(max_tokens=rng.choice([64, 200, 400, 1000] if full else [1, 4, 16, 64]),
                                        forced_tokens=forced)
                arrival = now - rng.uniform(0, 0.2) if late and rng.random() < late else now
                r = Request(f"r{n}", lane, rng.choice(members), prompt, arrival, kind=kind, params=params,
                            public_len=rng.choice([0, 8]))
                n += 1
                try:
                    sched.add_request(r)
                    ids.append(r.request_id)
                    out.write(f"add {r.request_id} {lane} {r.member} {len(prompt)} pool {r.pool}\n")
                except (NoRoom, QueueFull) as e:
                    out.write(f"refused {r.request_id} {type(e).__name__} {e}\n")
        if ids and rng.random() < 0.03:
            rid = rng.choice(ids)
            r = sched.abort(rid, "abort", now)
            out.write(f"abort {rid} {r is not None}\n")
        hold = rng.random() < 0.05
        out.write(f"work {sched.has_work()} iw {sched.has_interactive_work()} wake {sched.next_wakeup(now)!r}\n")
        plan = sched.schedule(now, hold_background=hold)
        out.write(plan_repr(plan) + "\n")
        if plan.idle:
            now += rng.choice([0.001, 0.02, 0.2])
            continue
        ms = sum(c * x for c, x in zip(coef, plan.shape)) * rng.uniform(0.8, 1.3)
        if rng.random() < 0.02:
            res = StepResult(elapsed_ms=ms, no_kv_slot=True)
        else:
            res = StepResult(samples={i.request_id: Sample(rng.randint(3, 99), is_eog=rng.random() < 0.03)
                                      for i in plan.generating if i.sample},
                             embeddings={i.request_id: [1.0] for i in plan.batches[list(plan.batches)[-1]] if i.sample},
                             elapsed_ms=ms)
        if rng.random() < 0.01:
            failed = sched.fail(plan, now)
            out.write(f"fail {[r.request_id for r in failed]}\n")
            continue
        now += ms / 1000.0
        outs = sched.update(plan, res, now)
        out.write(" out " + " ".join(f"{o.request.request_id}:{o.sample.token if o.sample else '-'}:{int(o.finished)}"
                                      for o in outs) + "\n")
        for o in outs:
            if o.sample is not None and rng.random() < 0.02 and not o.finished:
                sched.finish(o.request.request_id, "stop", now)
                out.write(f"finish {o.request.request_id}\n")
        out.write(f" coef {sched.cost.coefficients!r} credit {sched.share.credit!r} counters "
                  f"{sorted(sched.fair.counters.items())!r} typical {sorted(sched.pacing.typical.items())!r}\n")


def main() -> None:
    path = sys.argv[1]
    lo, hi = map(int, (sys.argv[2] if len(sys.argv) > 2 else "0-40").split("-"))
    with open(path, "w") as out:
        for seed in range(lo, hi):
            scenario(seed, out)


if __name__ == "__main__":
    main()
