"""Placed where it fits now, with the real model and both llama.cpp caches (issue 54).

The scheduler's interactive cache is cut to 512 cells (the runner's own is larger, so the
scheduler's limit is the one that binds). Another member's long chat holds most of it; alice's
question comes: it is read now in the main cache, beside bob's answer, not after it. Her next
turn then goes on from her cells in the main cache (its longest prefix lives there), and what
it computes there matches the same turn read whole with the cache off, position by position.

Run: .venv/bin/python -m pytest -q tests/engine/test_placed_where_it_fits.py
"""

from __future__ import annotations

import pytest

from homeai.sched.pools import Pool
from homeai.sched.request import Request, SamplingParams, Status
from tests.engine.test_prefix_reuse import Driver, assert_same, chat, forced, greedy, reference

pytestmark = pytest.mark.model

INTERACTIVE_CELLS = 512
QUESTION = "Which lights are in the kitchen?"


class SteadyDriver(Driver):
    """`Driver` with every step taken as 10 ms: the cost model, and so the readers' pace that
    admission keeps, is the same on a busy box as on a quiet one."""

    def step(self):
        plan = self.sched.schedule(self.now)
        self.plans.append(plan)
        result = self.runner.run(plan)
        result.elapsed_ms = 10.0
        self.sched.update(plan, result, self.now + 0.05)
        self.now += 0.1
        return plan


def test_a_chat_is_read_in_the_main_cache_while_its_own_is_full_and_goes_on_there(runner):
    first = chat(runner, QUESTION)
    solo = Driver(runner)
    turn1 = greedy(first, 12, "turn1")
    solo.run(turn1)
    tokens = chat(runner, QUESTION, runner.detokenize(turn1.output_tokens), "Turn the first one on.")
    outputs, ref = reference(runner, tokens)

    d = SteadyDriver(runner, interactive_cells=INTERACTIVE_CELLS)
    story = runner.tokenize("Story: " + "the warm room " * 130)
    assert len(story) + 80 <= INTERACTIVE_CELLS < len(story) + len(first)  # bob's fits; not both
    bob = Request("bob", "chat", "bob", story, 0.0,
                  params=SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))
    d.run(bob, until=lambda: bob.is_decoding)
    assert bob.pool is Pool.INTERACTIVE
    again = greedy(first, 12, "turn1")
    d.run(again, until=lambda: again.finished)
    assert again.pool is Pool.MAIN and bob.status is Status.RUNNING  # read beside bob's answer, not after it
    assert again.output_tokens and bob.num_preemptions == 0
    d.run()  # bob's answer ends: both caches have room for the next turn
    assert d.sched.pools.cells_cached(Pool.MAIN) >= len(first) and d.sched.pools.cells_cached(Pool.INTERACTIVE) > 0

    target = forced(tokens, outputs)
    d.run(target)
    assert target.pool is Pool.MAIN and target.num_cached_tokens >= len(first) - 1  # her first turn, reused there
    assert_same(ref, target)
