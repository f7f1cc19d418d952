"""Prompt reads under thread settings, interleaved in one process (issue 27).

Run from the checkout: PYTHONPATH=. .venv/bin/python scripts/threads_bench.py [--busy N] [--rounds R]
Each round reads a fresh ~1,300-token Home Assistant-shaped prompt (1 output token) under each
setting (threads for one-token steps / threads for batches), in alternating order; each reading is
printed as it comes (the box is shared), then medians and ratios to all cores.
"""
import argparse, os, random, statistics, subprocess
import llama_cpp as ll
from tests.conftest import small_config
from homeai.app import load_runner
from homeai.llama import Runner  # its core following, traced below
from homeai.engine.engine import Engine
from homeai.sched.scheduler import SchedulerLimits
from homeai.sched.request import SamplingParams
from lanes import DEFAULT_POLICIES

ap = argparse.ArgumentParser()
ap.add_argument("--busy", type=int, default=0, help="niced busy loops beside (the neighbour bench's)")
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
cores = os.cpu_count()
SETTINGS = [(cores, cores), (max(cores - 1, 1), max(cores - 1, 1)), "watch"]  # watch: n_threads 0, the new default

cfg = small_config(n_threads=cores, n_ctx=4096, interactive_n_ctx=4096, n_batch=512)
r = load_runner(cfg, embeddings=False, grammar=False)
m = r.cfg
e = Engine(r, dict(DEFAULT_POLICIES), SchedulerLimits(num_cells=m.n_ctx, num_seqs=m.n_seq_max, max_step_tokens=m.n_batch,
           embed_max_tokens=m.embed_n_ctx, embed_max_seqs=m.embed_n_seq_max, interactive_cells=m.interactive_n_ctx)).start()


def ha_prompt(nonce):
    rooms = ["kitchen", "living room", "bedroom", "office", "hall", "garage", "garden", "bathroom"]
    lines = [f"Session {nonce}. You are a voice assistant for Home Assistant. Current time 18:04. Devices:"]
    for i in range(27):  # ~1,300 tokens with the template
        room = rooms[i % len(rooms)]
        lines.append(f"light.{room.replace(' ', '_')}_{i}: '{room.title()} lamp {i}', state off, brightness 0, area {room}")
        lines.append(f"sensor.{room.replace(' ', '_')}_temp_{i}: '{room.title()} temperature', 21.{i % 10} C")
    return r.apply_chat_template([{"role": "system", "content": "\n".join(lines)},
                                  {"role": "user", "content": "Turn on the kitchen lamp."}])


steps_at = []  # llama.cpp's threads at each step of the current reading (Runner._follow_cores)
_follow = Runner._follow_cores


def _traced_follow(runner):
    _follow(runner)
    steps_at.append(runner.num_threads)


Runner._follow_cores = _traced_follow


def read_s(threads):
    from homeai.threads import CoreWatch
    steps_at.clear()
    if threads == "watch":
        r.core_watch = CoreWatch()  # the runner asks it before each step (Runner._follow_cores)
    else:
        r.core_watch, r.num_threads = None, threads[0]
        for ctx in (r.ctx, r.ictx, r.embed_ctx):
            if ctx:
                ll.llama_set_n_threads(ctx, *threads)
    s = e.submit(ha_prompt(random.random()), params=SamplingParams(temperature=0, max_tokens=1))
    list(s)
    return s.finished.stats.ttft_ms / 1000, s.finished.stats.prompt_tokens


busy = [subprocess.Popen(["nice", "-n", "10", "sh", "-c", "while :; do :; done"], start_new_session=True)
        for _ in range(args.busy)]
try:
    res = {s: [] for s in SETTINGS}
    for rnd in range(args.rounds):
        for s in (SETTINGS if rnd % 2 == 0 else SETTINGS[::-1]):
            t, n = read_s(s)
            res[s].append(t)
            counts = {n: steps_at.count(n) for n in sorted(set(steps_at))}
            chose = f", the watch's threads per step: {counts}" if s == "watch" else ""
            print(f"round {rnd} threads {s}: {n} tokens read in {t:.2f} s (load {os.getloadavg()[0]:.1f}){chose}", flush=True)
    base = statistics.median(res[SETTINGS[0]])
    for s in SETTINGS:
        med = statistics.median(res[s])
        print(f"threads {s}: median {med:.2f} s, speed {base / med:.2f}x all cores; {[round(x, 2) for x in res[s]]}")
finally:
    for b in busy:
        b.kill()
    e.stop()
