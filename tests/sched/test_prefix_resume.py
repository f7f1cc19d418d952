"""A cached prefix is reused only where its sequence may be resumed exactly (issue 50): a sliding
window's cells llama.cpp gave to others, a recurrent state that cannot be cut (`prefix.Memory`).

The fake runner holds what the scheduler computed; `Held` plays llama.cpp's answer to "which
positions does this sequence still hold" (llama_memory_seq_pos_min/max), with the positions a
test says llama.cpp gave away.
"""

from __future__ import annotations

import itertools

import pytest

from homeai.sched.pools import Copy, Drop, Pool
from homeai.sched.prefix import Memory, resumable
from homeai.sched.request import Request, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits
from lanes import DEFAULT_POLICIES
from tests.sched.helpers import FakeRunner, run_until_idle, step

_ids = itertools.count()
SYSTEM = list(range(100, 1100))  # a 1000-token system prompt: longer than the 512-token window
WINDOW = 512


class CutRunner(FakeRunner):
    """The fake runner, keeping each cut: a Drop that leaves a sequence some of its cells."""

    def __init__(self):
        super().__init__()
        self.cuts: list[Drop] = []

    def run(self, plan):
        for pool, pool_ops in plan.cache_ops.items():
            for op in pool_ops:
                if isinstance(op, Drop) and 0 < op.start < self.positions.get((pool, op.seq_id), 0):
                    self.cuts.append(op)
        return super().run(plan)


class Held:
    """llama.cpp's view of the fake runner's cells: a sequence holds [first, end), end as computed,
    first as the test says llama.cpp gave the positions below it away."""

    def __init__(self, runner: FakeRunner):
        self.runner = runner
        self.first: dict[tuple[Pool, int], int] = {}

    def __call__(self, pool, seq_id: int) -> tuple[int, int]:
        end = self.runner.positions.get((pool, seq_id), 0)
        return (min(self.first.get((pool, seq_id), 0), end), end) if end else (0, 0)


def cached(*, window=0, recurrent=False, **overrides):
    runner = CutRunner()
    held = Held(runner)
    limits = dict(num_cells=8192, num_seqs=16, max_step_tokens=256, embed_max_tokens=512, embed_max_seqs=16,
                  min_chunk=8, prompt_cache=True, max_step_ms=1000.0)
    limits.update(overrides)
    sched = Scheduler(dict(DEFAULT_POLICIES), SchedulerLimits(**limits),
                      memory=Memory(window=window, recurrent=recurrent, held=held))
    return sched, runner, held


def request(prompt, max_tokens=4, arrival=0.0) -> Request:
    return Request(f"q{next(_ids)}", "chat", "alice", list(prompt), arrival, params=SamplingParams(max_tokens=max_tokens))


def first_item(runner, r):
    return next(i for plan in runner.plans for i in plan.items if i.request_id == r.request_id)


def ops(runner, pool=Pool.MAIN):
    return [op for plan in runner.plans for op in plan.cache_ops.get(pool, [])]


def finished_entry(sched, runner, prompt):
    first = request(prompt)
    sched.add_request(first)
    now = run_until_idle(sched, runner)
    (seq,) = sched.pools.cache[Pool.MAIN].entries
    return first, seq, now


@pytest.mark.parametrize("n, first, end, window, recurrent, ok", [
    (600, 0, 1004, 512, False, True),  # every cell held: cut anywhere
    (600, 89, 1004, 512, False, True),  # positions 89..599 are the window before 600
    (600, 90, 1004, 512, False, False),  # position 89 was given away
    (1004, 493, 1004, 512, False, True),  # the whole sequence resumes where it ends
    (300, 1, 1004, 512, False, False),  # a short prefix needs position 0
    (1005, 0, 1004, 512, False, False),  # past what it holds
    (600, 0, 1004, 0, False, True),  # no window
    (600, 0, 1004, 0, True, False),  # a recurrent state is never cut
    (1004, 1003, 1004, 0, True, True),  # and resumes where it ends
    (0, 0, 0, 512, False, True),  # nothing reused is always exact
])
def test_where_a_sequence_may_be_resumed(n, first, end, window, recurrent, ok):
    assert resumable(n, first, end, window=window, recurrent=recurrent) is ok


def test_a_window_still_held_is_reused_and_cut():
    sched, runner, held = cached(window=WINDOW)
    first, seq, now = finished_entry(sched, runner, SYSTEM + list(range(2000, 2100)))
    held.first[Pool.MAIN, seq] = 1000 - WINDOW + 1  # the window before 1000 is still there
    other = request(SYSTEM + [7, 8, 9], arrival=now)
    sched.add_request(other)
    run_until_idle(sched, runner, now)
    assert other.num_cached_tokens == 1000 and first_item(runner, other).start == 1000


def test_a_window_given_away_is_read_again_and_the_entry_kept():
    sched, runner, held = cached(window=WINDOW)
    first, seq, now = finished_entry(sched, runner, SYSTEM + list(range(2000, 2100)))
    # llama.cpp gave every position out of the window of its last (0..1103-512) to others' tokens
    held.first[Pool.MAIN, seq] = 1103 - WINDOW + 1
    other = request(SYSTEM[:700] + [7, 8, 9], arrival=now)  # would resume at 700: needs 189..699
    sched.add_request(other)
    plan, _ = step(sched, runner, now)
    assert other.num_cached_tokens == 0 and first_item(runner, other).start == 0
    assert not runner.cuts and not any(isinstance(op, Copy) for op in plan.cache_ops.get(Pool.MAIN, []))
    assert seq in sched.pools.cache[Pool.MAIN].entries, "the entry stays for its own next turn"
    # its own next turn resumes where it ended: the window before that is held
    turn2 = request(first.prompt_tokens + first.output_tokens + [5, 6], arrival=now + 1)
    sched.add_request(turn2)
    run_until_idle(sched, runner, now + 1)
    assert turn2.num_cached_tokens == first.num_computed_tokens == 1103


def test_a_longer_entry_given_away_yields_to_a_shorter_one_still_held():
    sched, runner, held = cached(window=WINDOW)
    short, short_seq, now = finished_entry(sched, runner, SYSTEM[:800] + list(range(3000, 3900)))
    long = request(SYSTEM + list(range(2000, 2100)), arrival=now)  # shares the short one's first 800 cells
    sched.add_request(long)
    now = run_until_idle(sched, runner, now)
    (long_seq,) = set(sched.pools.cache[Pool.MAIN].entries) - {short_seq}
    held.first[Pool.MAIN, long_seq] = 1103 - WINDOW + 1  # 900 needs 389..899
    other = request(SYSTEM[:900] + [7, 8, 9], arrival=now)  # 900 with the long one, 800 with the short one
    sched.add_request(other)
    run_until_idle(sched, runner, now)
    assert other.num_cached_tokens == 800


@pytest.mark.parametrize("memory", [dict(), dict(window=WINDOW)], ids=["plain", "window"])
def test_a_plain_or_windowed_cache_still_cuts_an_entry_short_of_its_window(memory):
    sched, runner, _ = cached(**memory)
    first, seq, now = finished_entry(sched, runner, SYSTEM[:300] + list(range(2000, 2100)))
    edited = request(SYSTEM[:300] + [9, 9, 9], arrival=now)  # every position was held: no window passed
    sched.add_request(edited)
    run_until_idle(sched, runner, now)
    assert edited.num_cached_tokens == 300


def test_a_recurrent_state_resumes_only_where_it_ends():
    sched, runner, _ = cached(recurrent=True)
    first, seq, now = finished_entry(sched, runner, SYSTEM)
    for prompt in (SYSTEM[:600] + [7, 8], SYSTEM):  # cut short; the same prompt (its last token read again)
        other = request(prompt, arrival=now)
        sched.add_request(other)
        now = run_until_idle(sched, runner, now)
        assert other.num_cached_tokens == 0
    turn2 = request(first.prompt_tokens + first.output_tokens + [5, 6], arrival=now)
    sched.add_request(turn2)
    run_until_idle(sched, runner, now)
    assert turn2.num_cached_tokens == first.num_computed_tokens
    assert not runner.cuts, "no recurrent state was cut"


def test_a_recurrent_entry_over_the_cap_goes_whole():
    sched, runner, _ = cached(recurrent=True, prompt_cache_max_cells=500)
    request_ = request(SYSTEM)
    sched.add_request(request_)
    run_until_idle(sched, runner)
    assert sched.pools.cells_cached(Pool.MAIN) == 0 and not sched.pools.cache[Pool.MAIN].entries
    assert not any(isinstance(op, Drop) and op.start == 500 for op in ops(runner))


def test_a_recurrent_reader_is_not_waited_for():
    sched, runner, _ = cached(recurrent=True)
    reader = request(SYSTEM + [1], max_tokens=2)
    sched.add_request(reader)
    step(sched, runner, 0.0)  # reading its prompt
    assert reader.num_computed_tokens < len(SYSTEM)
    other = request(SYSTEM + [2], max_tokens=2)
    assert not sched.pools.shares_a_prefix_being_read(other)


def test_a_recurrent_turn_arriving_as_its_entry_is_cached_resumes_it():
    """The entry's cells past what was computed are dropped as it is cached (`Drop(seq, computed)`,
    applied with the next step): for a state that ends there, that cuts nothing."""
    sched, runner, _ = cached(recurrent=True)
    first, seq, now = finished_entry(sched, runner, SYSTEM)  # its Drop is not applied yet
    turn2 = request(first.prompt_tokens + first.output_tokens + [5, 6], arrival=now)
    sched.add_request(turn2)
    run_until_idle(sched, runner, now)
    assert turn2.num_cached_tokens == first.num_computed_tokens


def test_a_recurrent_state_past_its_pending_cut_is_not_resumed():
    """A state that went past what was computed (an aborted chunk) is cut as it is cached: llama.cpp
    refuses, and the runner drops it whole, so nothing of it is resumed."""
    sched, runner, _ = cached(recurrent=True)
    first, seq, now = finished_entry(sched, runner, SYSTEM)
    runner.positions[Pool.MAIN, seq] += 5  # llama.cpp's state holds 5 positions more
    turn2 = request(first.prompt_tokens + first.output_tokens + [5, 6], arrival=now)
    sched.add_request(turn2)
    step(sched, runner, now)
    assert turn2.num_cached_tokens == 0
