"""How homeai's compute threads wait: the OpenMP wait policy, set before any OpenMP runtime loads.

llama.cpp (ggml) runs each step on an OpenMP team whose threads meet at `#pragma omp barrier`
hundreds of times a token, and faster-whisper's CTranslate2 brings its own copy of libgomp.
libgomp reads its wait policy once, when it loads: unset, a waiting thread spins about 300,000
times before it sleeps. On a CPU shared with a busy neighbour (a compile, a transcode, even at
nice 10 from another session or service, whose CPU weight equals homeai's) that collapses: a
thread spinning for a partner who was preempted burns its own time slice, so each barrier costs
a slice, and a 10 ms decode step took 120 ms to seconds (docs/benchmarks.md, "Noisy
neighbour"). Sleeping at once (PASSIVE) survives the neighbour but makes every barrier a futex
wake: 3x slower on a quiet box. A short spin (SPIN_COUNT) keeps the quiet speed and bounds what
a preempted partner costs. Both runtimes get the same policy; a policy the user set wins.

The default thread count follows the rest of the box (`CoreWatch`): every core while other
processes leave the CPU idle, a core fewer for each core they keep busy. A fixed count either
halves every prompt read on a quiet two-core box (one thread: a 1,300-token prompt took 14.8 s
against 7.2-7.9 s with two) or lets a neighbour stall each step (two threads beside two busy
loops: a chat 4.1x quiet, against 1.2x with one; on two cores one thread has no barrier to wait
at). llama.cpp takes a context's thread count at run time (`llama_set_n_threads`), so the runner
asks before each step; the watch reads the CPU time of the whole machine and of this process
(/proc/stat, /proc/self/stat) at most every `WATCH_INTERVAL_S`, so what homeai itself runs never
counts as a neighbour. A neighbour gets its core at the first reading that sees it; the core
comes back about 1.5 s after the neighbour leaves (a pause between its bursts keeps it away).

This module is imported first by `homeai/__init__.py`, so it runs before `llama_cpp` or
`faster_whisper` is imported, however homeai is started (serve, bench, tests).
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

SPIN_COUNT = "3000"  # ~tens of microseconds of spinning, then sleep: see the module docstring
POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def apply_wait_policy(environ=os.environ) -> None:
    """Set libgomp's spin count for every OpenMP runtime the process loads, unless the user chose."""
    if not any(environ.get(name) for name in POLICY_VARS):
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT


WATCH_INTERVAL_S = 0.5  # how often the watch reads the CPU times (two small /proc reads)
NEIGHBOUR_CORES = 0.25  # others' CPU use, in cores, that takes a core from homeai (more: one more core)
SMOOTHING = 0.5  # weight of a lower reading in the estimate of others' CPU use (a higher one is taken whole)


def default_threads(num_cores: int | None = None) -> int:
    """llama.cpp threads when the config says 0 and the box is quiet: every core."""
    return num_cores or os.cpu_count() or 1


def cpu_times() -> tuple[float, float] | None:
    """Seconds of CPU the whole machine and this process have used (None off Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()[1:]
        with open("/proc/self/stat", encoding="ascii") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: busy is all but idle and iowait
    busy = sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, (int(own[11]) + int(own[12])) / tick  # utime, stime (fields 14 and 15)


class CoreWatch:
    """llama.cpp threads for the next step: every core less those other processes keep busy."""

    def __init__(self, num_cores: int | None = None, read: Callable[[], tuple[float, float] | None] = cpu_times,
                 clock: Callable[[], float] = time.monotonic):
        self.num_cores = default_threads(num_cores)
        self.read, self.clock = read, clock
        self.others: float | None = None  # cores other processes keep busy, smoothed (None: not read yet)
        self.last = (clock(), read())
        self.num_threads = self.num_cores if self.last[1] is not None else max(self.num_cores - 1, 1)

    def threads(self) -> int:
        now = self.clock()
        then, before = self.last
        if before is None or now - then < WATCH_INTERVAL_S:
            return self.num_threads
        times = self.read()
        self.last = (now, times)
        if times is None:
            return self.num_threads
        others = max((times[0] - before[0]) - (times[1] - before[1]), 0.0) / (now - then)
        if self.others is None or others > self.others:
            self.others = others  # a neighbour is given its core at once: each step it stalls costs a slice
        else:
            self.others += SMOOTHING * (others - self.others)  # and kept a little while it pauses
        taken = max(math.ceil(self.others - NEIGHBOUR_CORES), 0)
        self.num_threads = min(max(self.num_cores - taken, 1), self.num_cores)
        return self.num_threads

    def describe(self) -> str:
        """What `homeai doctor` says, after one reading."""
        time.sleep(WATCH_INTERVAL_S)
        now = self.threads()
        busy = "" if self.others is None else f"; other processes keep {self.others:.1f} cores busy"
        return (f"{now} now{busy} (model.n_threads 0: every core of {self.num_cores} while the rest of the box "
                f"is idle, a core fewer for each core other processes keep busy)")


def wait_policy(environ=os.environ) -> str:
    """The policy in force, as `homeai doctor` shows it."""
    set_ = [f"{name}={environ[name]}" for name in POLICY_VARS if environ.get(name)]
    return ", ".join(set_) or "libgomp default (spin 300000, then sleep)"


apply_wait_policy()
