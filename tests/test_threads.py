"""The OpenMP wait policy is set before any runtime loads, however homeai starts; the default thread count."""

import os
import subprocess
import sys

from homeai import threads


def test_the_spin_count_is_set_unless_the_user_chose_a_policy():
    env = {}
    threads.apply_wait_policy(env)
    assert env == {"GOMP_SPINCOUNT": threads.SPIN_COUNT}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "0"}):
        env = dict(chosen)
        threads.apply_wait_policy(env)
        assert env == chosen
    assert "GOMP_SPINCOUNT=3000" in threads.wait_policy({"GOMP_SPINCOUNT": "3000"})


def test_importing_any_homeai_module_sets_it_before_llama_cpp_and_faster_whisper_load():
    env = {k: v for k, v in os.environ.items() if k not in threads.POLICY_VARS}
    code = ("import homeai.speech.stt, homeai.llama, os, sys; "
            "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'), "
            "[m for m in ('llama_cpp', 'faster_whisper') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    # Both runtimes loaded under the same policy, and it stays set (no per-import dance).
    assert out.stdout.split("\n")[-2] == f"{threads.SPIN_COUNT} None ['llama_cpp', 'faster_whisper']"


def watch(num_cores, others_cores: list[float], own_cores: float = 1.5):
    """A CoreWatch over a made-up machine: each reading `WATCH_INTERVAL_S` later, other processes
    having used the next of `others_cores` (in cores) and homeai `own_cores` meanwhile."""
    clock = [0.0]
    times = [0.0, 0.0]  # the machine's and this process's CPU seconds
    step = threads.WATCH_INTERVAL_S

    def read():
        return tuple(times)

    w = threads.CoreWatch(num_cores, read=read, clock=lambda: clock[0])
    seen = []
    for others in others_cores:
        clock[0] += step
        times[0] += (others + own_cores) * step
        times[1] += own_cores * step
        seen.append(w.threads())
    return seen


def test_every_core_while_the_box_is_quiet_however_busy_homeai_itself_is():
    assert threads.default_threads(2) == 2
    assert watch(2, [0.0, 0.05, 0.1], own_cores=2.0) == [2, 2, 2]
    assert watch(16, [0.2] * 3) == [16] * 3


def test_a_core_fewer_for_each_core_a_neighbour_keeps_busy_and_all_again_when_it_leaves():
    # Two busy loops on two cores: one thread at once (no barrier to wait at); they stop: two again in 1.5 s.
    assert watch(2, [2.0, 2.0, 2.0, 0.0, 0.0, 0.0]) == [1, 1, 1, 1, 1, 2]
    assert watch(2, [0.0, 2.0, 0.0, 2.0]) == [2, 1, 1, 1]  # a neighbour's short pause keeps it its core
    assert watch(16, [3.0, 3.0, 3.0]) == [13, 13, 13]
    assert watch(2, [8.0]) == [1]  # never below one


def test_between_readings_and_off_linux_the_count_stays():
    clock = [0.0]
    w = threads.CoreWatch(4, read=lambda: (clock[0] * 3, 0.0), clock=lambda: clock[0])
    assert w.threads() == 4  # no reading yet
    clock[0] = threads.WATCH_INTERVAL_S / 2
    assert w.threads() == 4  # too soon to read again
    clock[0] = threads.WATCH_INTERVAL_S
    assert w.threads() == 1  # three other cores busy
    assert threads.CoreWatch(4, read=lambda: None).threads() == 3  # cannot tell: leave one core, as before
