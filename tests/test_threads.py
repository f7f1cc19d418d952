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
    code = ("import homeai.speech.stt, homeai.engine.runner, os, sys; "
            "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'), "
            "[m for m in ('llama_cpp', 'faster_whisper') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    # Both runtimes loaded under the same policy, and it stays set (no per-import dance).
    assert out.stdout.split("\n")[-2] == f"{threads.SPIN_COUNT} None ['llama_cpp', 'faster_whisper']"


def test_the_default_thread_count_leaves_a_core_free():
    assert [threads.default_threads(n) for n in (1, 2, 8)] == [1, 1, 7]
