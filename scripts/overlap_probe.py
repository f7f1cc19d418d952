"""What overlapping a step's Python with its decode can gain on a CPU, where llama_decode computes
before it returns (issue 30). One sequence decodes greedily; each step also does W microseconds
of Python work (the stand-in for planning the next step):

* `raw`: no work, the bare loop;
* `serial`: the work, then the decode (the plain engine loop's order);
* `helper`: the work in a second thread while this one is in llama_decode (which holds no GIL), the
  step waiting for both: what a CPU engine that planned ahead on another thread would get.

    .venv/bin/python scripts/overlap_probe.py /tmp/tiny.gguf [--work 0,100,300] [--steps 200] [--reps 9]

Load the model with one thread (the default here) on a box with a core to spare. Medians of
`--reps` alternating runs, ms per step, and each side's ratio to raw.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from homeai.config import from_dict
from homeai.app import load_runner
from homeai.llama import Runner  # for its type
from homeai.sched.pools import Pool


def busy(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


class Helper:
    """A thread that does `work` once each time it is started, and says when it is done."""

    def __init__(self, work):
        self.work, self.go, self.done = work, threading.Semaphore(0), threading.Semaphore(0)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.go.acquire()
            self.work()
            self.done.release()


def run(runner: Runner, prompt: list[int], steps: int, work_us: float, mode: str, helper: Helper) -> float:
    runner.reset()
    [[token]] = runner.decode_greedy([(Pool.MAIN, [(0, 0, prompt)])])
    position = len(prompt)
    start = time.perf_counter()
    for _ in range(steps):
        if mode == "serial":
            busy(work_us)
        elif mode == "helper":
            helper.go.release()
        [[token]] = runner.decode_greedy([(Pool.MAIN, [(0, position, [token])])])
        if mode == "helper":
            helper.done.acquire()
        position += 1
    return (time.perf_counter() - start) / steps * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--work", default="0,100,300", help="microseconds of Python work a step")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    cfg = from_dict({"model": {"path": str(args.model), "n_threads": args.threads}})
    runner = load_runner(cfg, embeddings=False, grammar=False)
    prompt = runner.tokenize("Tell me a story about a dragon.")
    print("| work (us) | raw ms/step | serial ms/step | helper ms/step | serial / raw | helper / raw |")
    print("|---:|---:|---:|---:|---:|---:|")
    for work_us in [float(w) for w in args.work.split(",")]:
        helper = Helper(lambda: busy(work_us))
        times = {mode: [] for mode in ("raw", "serial", "helper")}
        for _ in range(args.reps):
            for mode in times:
                times[mode].append(run(runner, prompt, args.steps, work_us, mode, helper))
        m = {mode: statistics.median(t) for mode, t in times.items()}
        print(f"| {work_us:.0f} | {m['raw']:.3f} | {m['serial']:.3f} | {m['helper']:.3f} | "
              f"{m['raw'] / m['serial']:.2f} | {m['raw'] / m['helper']:.2f} |")
    runner.close()


if __name__ == "__main__":
    main()
