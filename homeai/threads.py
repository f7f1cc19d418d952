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

The default thread count leaves a core to the rest of the box (`default_threads`): on two cores
one llama.cpp thread has no barrier to wait at, and kept a 16-token chat within 2x of quiet
beside two busy loops, where two threads took 3-10x.

This module is imported first by `homeai/__init__.py`, so it runs before `llama_cpp` or
`faster_whisper` is imported, however homeai is started (serve, bench, tests).
"""

from __future__ import annotations

import os

SPIN_COUNT = "3000"  # ~tens of microseconds of spinning, then sleep: see the module docstring
POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def apply_wait_policy(environ=os.environ) -> None:
    """Set libgomp's spin count for every OpenMP runtime the process loads, unless the user chose."""
    if not any(environ.get(name) for name in POLICY_VARS):
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT


def default_threads(num_cores: int | None = None) -> int:
    """llama.cpp threads when the config says 0: every core but one, at least one."""
    cores = num_cores or os.cpu_count() or 1
    return max(cores - 1, 1)


def wait_policy(environ=os.environ) -> str:
    """The policy in force, as `homeai doctor` shows it."""
    set_ = [f"{name}={environ[name]}" for name in POLICY_VARS if environ.get(name)]
    return ", ".join(set_) or "libgomp default (spin 300000, then sleep)"


apply_wait_policy()
