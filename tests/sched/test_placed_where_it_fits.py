"""A request is admitted into whichever cache of its lane has room for it now (issue 54).

With a cache of their own for the interactive lanes (`TwoCaches`), a chat may be read in either
cache that holds its prompt and answer (`Request.pools`). When it is admitted it goes in one with
room then (`Admission.place`): its lane's own, unless the other holds a prefix it may reuse
longer by a whole step of reading. So it never waits for its own full cache while the main one
has room; a conversation whose last turn was read in the main cache goes on from its cells
there; it preempts background only when no cache has room for it (and background is above its
floor); a chat preempted later is placed again the same way. With one cache for every lane
nothing changes.

The scene Open WebUI met: one user's long prompt fills the interactive cache while the main one
has thousands of cells free; the next user's message queued 71.6 s for the interactive cache.

Run: .venv/bin/python -m pytest -q tests/sched/test_placed_where_it_fits.py
"""

from __future__ import annotations

from homeai.sched.pools import Pool
from homeai.sched.request import Request, SamplingParams, Status
from tests.sched.helpers import (FakeRunner, cpu_ms, create_request, create_scheduler, run_until_idle, step, taught,
                                 token_for)


def two_caches(**limits):
    return create_scheduler(**{"num_cells": 1000, "num_seqs": 4, "interactive_cells": 200, **limits})


def run_until(sched, runner, now, done):
    for _ in range(1000):
        if done():
            return now
        step(sched, runner, now)
        now += 0.01
    raise AssertionError("never came")


def admitted(sched, runner, now, request):
    """Step until `request` holds a sequence (its lane's batching window may keep it a step or two)."""
    return run_until(sched, runner, now, lambda: request.status is not Status.WAITING)


def answered_right(request) -> bool:
    """Its output is the fake model's for its own positions: whatever cache read it, and however
    often it was preempted, it computed exactly its own sequence."""
    return request.output_tokens == [token_for(request.request_id, request.num_prompt_tokens + k)
                                     for k in range(len(request.output_tokens))]


def bob_decoding(sched, runner, now=0.0, num_prompt=150, max_tokens=40):
    """Another member's chat holding most of the interactive cache (150 + 40 of its 200 cells)."""
    bob = create_request(lane="chat", member="bob", num_prompt=num_prompt, max_tokens=max_tokens, arrival=now)
    sched.add_request(bob)
    return bob, run_until(sched, runner, now, lambda: bob.is_decoding)


def follow_up(turn: Request, num_new: int, arrival: float, max_tokens: int = 6) -> Request:
    """The member's next turn: the whole last turn, its answer, and `num_new` tokens more."""
    tokens = turn.prompt_tokens + turn.output_tokens + [(k * 13) % 900 + 10 for k in range(num_new)]
    return Request(f"{turn.request_id}-next", turn.lane, turn.member, tokens, arrival,
                   params=SamplingParams(max_tokens=max_tokens))


def test_a_chat_whose_own_cache_is_full_is_admitted_now_into_the_main_one():
    sched, runner = two_caches(), FakeRunner()
    bob, now = bob_decoding(sched, runner)
    alice = create_request(lane="chat", member="alice", num_prompt=120, max_tokens=6, arrival=now)
    sched.add_request(alice)
    assert alice.pools == (Pool.INTERACTIVE, Pool.MAIN)  # both hold it; its own is tried first
    now = admitted(sched, runner, now, alice)
    assert alice.pool is Pool.MAIN and bob.status is Status.RUNNING  # admitted now, not after bob
    assert bob.num_preemptions == 0
    run_until_idle(sched, runner, now)
    assert alice.first_token_time < bob.finish_time
    assert answered_right(alice) and answered_right(bob) and len(alice.output_tokens) == 6
    assert sched.pools.cells_used(Pool.MAIN) == 0 and sched.pools.cells_used(Pool.INTERACTIVE) == 0


def test_with_room_in_both_a_chat_goes_in_its_own_cache():
    sched, runner = two_caches(), FakeRunner()
    bob, now = bob_decoding(sched, runner, num_prompt=60, max_tokens=20)
    alice = create_request(lane="chat", member="alice", num_prompt=100, max_tokens=6, arrival=now)
    sched.add_request(alice)
    admitted(sched, runner, now, alice)
    assert alice.pool is Pool.INTERACTIVE and bob.status is Status.RUNNING


def alice_first_turn_in_main(**limits):
    """Alice's first turn, read in the main cache (120 tokens and room for 100 of answer, more than
    the interactive cache holds), ended after 6 at a stop string found outside: her 125 computed
    cells stay cached there, and the interactive cache is empty."""
    sched, runner = two_caches(prompt_cache=True, **limits), FakeRunner()
    turn1 = create_request(lane="chat", member="alice", num_prompt=120, max_tokens=100)
    sched.add_request(turn1)
    assert turn1.pools == (Pool.MAIN,)
    now = run_until(sched, runner, 0.0, lambda: len(turn1.output_tokens) == 6)
    sched.finish(turn1.request_id, "stop", now)
    assert sched.pools.cells_cached(Pool.MAIN) >= 120 and sched.pools.cells_cached(Pool.INTERACTIVE) == 0
    return sched, runner, now, turn1


def test_a_prefix_cached_in_the_main_cache_is_used_there():
    sched, runner, now, turn1 = alice_first_turn_in_main(max_step_tokens=64)  # 125 cells: two steps of reading
    turn2 = follow_up(turn1, 20, now)  # 146 tokens and 6 of answer: either cache holds it, both have room
    carol = create_request(lane="chat", member="carol", num_prompt=30, max_tokens=6, arrival=now)
    for r in (turn2, carol):
        sched.add_request(r)
    now = run_until(sched, runner, now, lambda: turn2.seq_id is not None and carol.seq_id is not None)
    assert turn2.pool is Pool.MAIN and turn2.num_cached_tokens >= 120  # from its own cells there
    assert carol.pool is Pool.INTERACTIVE  # nothing of hers anywhere: her lane's own cache
    run_until_idle(sched, runner, now)
    assert answered_right(turn2) and answered_right(carol)


def test_a_prefix_shorter_than_a_step_of_reading_leaves_a_chat_in_its_own_cache():
    """Reusing less than a step's reading (a shared system prompt, say) saves its first token a step
    at most; its answer would attend over the main cache's cells all the way."""
    sched, runner, now, turn1 = alice_first_turn_in_main(max_step_tokens=256)
    turn2 = follow_up(turn1, 20, now)
    sched.add_request(turn2)
    now = admitted(sched, runner, now, turn2)
    assert turn2.pool is Pool.INTERACTIVE and turn2.num_cached_tokens == 0
    run_until_idle(sched, runner, now)
    assert answered_right(turn2)


def test_a_prefix_in_a_cache_without_room_is_no_reason_to_wait():
    # A CPU's costs, so that alice's cached turn is worth keeping while the summary is read (`KVPools.expire`)
    sched, runner = (taught(two_caches(prompt_cache=True, background_min_share=0.95, max_step_tokens=64), cpu_ms),
                     FakeRunner(cost=cpu_ms))
    bob, now = bob_decoding(sched, runner)
    turn1 = create_request(lane="chat", member="alice", num_prompt=120, max_tokens=6, arrival=now)
    sched.add_request(turn1)
    now = run_until(sched, runner, now, lambda: turn1.finished)
    now = run_until_idle(sched, runner, now)
    # A summary takes what the main cache has free beside alice's cached turn (126 cells)
    summary = create_request(lane="summaries", num_prompt=850, max_tokens=20, arrival=now)
    sched.add_request(summary)
    now = run_until(sched, runner, now, lambda: summary.is_decoding)
    assert sched.pools.cells_cached(Pool.MAIN) >= 120  # her first turn is still there
    turn2 = follow_up(turn1, 30, now)  # 156 tokens: more than the main cache's free and cached cells
    sched.add_request(turn2)
    now = admitted(sched, runner, now, turn2)
    assert turn2.pool is Pool.INTERACTIVE and turn2.num_cached_tokens == 0  # read again, now
    assert summary.num_preemptions == 0 and summary.status is Status.RUNNING
    run_until_idle(sched, runner, now)
    assert turn2.first_token_time < summary.finish_time and answered_right(turn2) and answered_right(summary)


# ---- preemption by the same rule ---------------------------------------------------------

def summary_decoding(sched, runner, now, num_prompt):
    summary = create_request(lane="summaries", num_prompt=num_prompt, max_tokens=40, arrival=now)
    sched.add_request(summary)
    return summary, run_until(sched, runner, now, lambda: summary.is_decoding)


def test_free_room_in_the_main_cache_goes_before_preempting_background():
    sched, runner = two_caches(), FakeRunner()
    bob, now = bob_decoding(sched, runner)
    summary, now = summary_decoding(sched, runner, now, 600)
    alice = create_request(lane="chat", member="alice", num_prompt=120, max_tokens=6, arrival=now)
    sched.add_request(alice)
    admitted(sched, runner, now, alice)
    assert alice.pool is Pool.MAIN and summary.num_preemptions == 0 and bob.status is Status.RUNNING


def test_with_no_room_anywhere_a_chat_preempts_background_in_the_main_cache():
    sched, runner = two_caches(), FakeRunner()
    bob, now = bob_decoding(sched, runner, max_tokens=45)
    summary, now = summary_decoding(sched, runner, now, 900)
    alice = create_request(lane="chat", member="alice", num_prompt=120, max_tokens=6, arrival=now)
    sched.add_request(alice)
    now = admitted(sched, runner, now, alice)
    assert alice.pool is Pool.MAIN and summary.num_preemptions == 1
    assert bob.num_preemptions == 0  # another member's chat in her own cache is not the one that gives way
    run_until_idle(sched, runner, now)
    assert alice.first_token_time < bob.finish_time and alice.first_token_time < summary.finish_time
    assert answered_right(alice) and answered_right(summary) and len(summary.output_tokens) == 40


def test_background_at_its_floor_keeps_its_cells_and_the_chat_takes_the_first_cache_freed():
    sched, runner = two_caches(background_min_share=0.95), FakeRunner()
    bob, now = bob_decoding(sched, runner, max_tokens=10)
    summary, now = summary_decoding(sched, runner, now, 900)
    alice = create_request(lane="chat", member="alice", num_prompt=120, max_tokens=6, arrival=now)
    sched.add_request(alice)
    run_until_idle(sched, runner, now)
    assert summary.num_preemptions == 0 and alice.finished
    assert bob.finish_time <= alice.admitted_time < summary.finish_time  # bob's cells came first
    assert alice.pool is Pool.INTERACTIVE and answered_right(alice)


def test_a_chat_preempted_in_its_full_cache_is_placed_again_in_the_main_one():
    sched, runner = two_caches(num_seqs=6), FakeRunner()
    first = create_request(lane="chat", member="alice", num_prompt=150, max_tokens=40)
    second = create_request(lane="chat", member="alice", num_prompt=30, max_tokens=40)
    for r in (first, second):
        sched.add_request(r)
    now = run_until(sched, runner, 0.0, lambda: first.is_decoding and second.is_decoding)
    assert first.pool is second.pool is Pool.INTERACTIVE  # 180 of its 200 cells
    run_until_idle(sched, runner, now)  # their answers outgrow the cache: the newest gives way
    assert second.num_preemptions == 1 and first.num_preemptions == 0
    assert second.pool is Pool.MAIN  # its own cache still full: read again where there is room
    assert answered_right(first) and answered_right(second) and len(second.output_tokens) == 40


# ---- one cache for every lane: nothing changes --------------------------------------------

def test_with_one_cache_a_chat_waits_for_room_as_before():
    sched, runner = create_scheduler(num_cells=300, num_seqs=4), FakeRunner()
    bob, now = bob_decoding(sched, runner, num_prompt=200, max_tokens=90)
    alice = create_request(lane="chat", member="alice", num_prompt=120, max_tokens=6, arrival=now)
    sched.add_request(alice)
    assert alice.pools == (Pool.MAIN,) == bob.pools
    run_until_idle(sched, runner, now)
    assert alice.admitted_time >= bob.finish_time and bob.num_preemptions == 0
    assert answered_right(alice) and answered_right(bob)
