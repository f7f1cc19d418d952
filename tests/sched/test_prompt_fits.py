"""A prompt too long for its lane's cache is read where it fits, at its lane's priority.

With a cache of their own for the interactive lanes (`TwoCaches`), a chat whose prompt and
answer that cache cannot hold may live only in the main cache (`Scheduler.pools_for`); there it
may preempt background, down to background's floor, as every interactive request does in a cache
shared with background. A sequence no cache of its lane holds is refused when it is added.
(Which of several caches that hold a request it goes in, by their room when it is admitted:
`test_placed_where_it_fits.py`.)

Run: .venv/bin/python -m pytest -q tests/sched/test_prompt_fits.py
"""

from __future__ import annotations

import pytest

from homeai.sched.pools import Pool
from homeai.sched.request import Status
from homeai.sched.scheduler import NoRoom
from lanes import DEFAULT_POLICIES
from tests.sched.helpers import FakeRunner, create_request, create_scheduler, run_until_idle, step, token_for


def two_caches(**limits):
    return create_scheduler(**{"num_cells": 1000, "num_seqs": 4, "interactive_cells": 200, **limits})


def pools_of(plan, request) -> set[Pool]:
    return {pool for pool, items in plan.batches.items() if any(i.request_id == request.request_id for i in items)}


def test_each_request_may_go_in_the_caches_of_its_lane_that_hold_it_its_own_first():
    sched = two_caches(max_seq_len=900)
    assert sched.max_seq_lens("chat") == {Pool.INTERACTIVE: 200, Pool.MAIN: 900}  # the model's context caps the main
    assert sched.max_seq_lens("summaries") == {Pool.MAIN: 900}  # background never reads in the readers' cache
    assert sched.pools_for("chat", 100, 50) == (Pool.INTERACTIVE, Pool.MAIN)
    assert sched.pools_for("chat", 180, 50) == (Pool.MAIN,)
    assert sched.pools_for("chat", 180, 10_000) == (Pool.INTERACTIVE,)  # its answer cut at its own cache's edge
    assert sched.pools_for("chat", 900, 1) == () and sched.pools_for("summaries", 150, 10) == (Pool.MAIN,)
    # The first is where an answer's length is capped to (`Engine._check`)
    assert sched.pool_for("chat", 100, 50) is Pool.INTERACTIVE
    assert sched.pool_for("chat", 180, 50) is Pool.MAIN  # its answer would be cut at the interactive cache's edge
    assert sched.pool_for("chat", 180, 10_000) is Pool.INTERACTIVE  # no cache holds that answer: its own, cut there
    assert sched.pool_for("voice", 500, 10) is Pool.MAIN
    assert sched.pool_for("chat", 899, 1) is Pool.MAIN and sched.pool_for("chat", 900, 1) is None
    assert sched.pool_for("summaries", 150, 10) is Pool.MAIN
    one = create_scheduler(num_cells=1000)
    assert one.max_seq_lens("chat") == {Pool.MAIN: 1000} and one.pool_for("chat", 500, 10) is Pool.MAIN


def test_a_sequence_no_cache_of_its_lane_holds_is_refused_when_added():
    sched = two_caches()
    with pytest.raises(NoRoom, match="1001 tokens"):
        sched.add_request(create_request(lane="chat", num_prompt=1000))
    assert not sched.has_work()


def test_a_chat_too_long_for_the_interactive_cache_is_read_in_the_main_one_beside_a_short_chat():
    sched, runner = two_caches(), FakeRunner()
    long_chat = create_request(lane="chat", member="alice", num_prompt=300, max_tokens=6)
    short_chat = create_request(lane="chat", member="bob", num_prompt=40, max_tokens=6)
    for r in (long_chat, short_chat):
        sched.add_request(r)
    assert long_chat.pool is Pool.MAIN and short_chat.pool is Pool.INTERACTIVE
    assert long_chat.interactive and long_chat.priority == DEFAULT_POLICIES["chat"].priority  # its lane's, kept
    seen = {long_chat.request_id: set(), short_chat.request_id: set()}
    now = 0.01
    while sched.has_work():
        plan, _ = step(sched, runner, now)
        for r in (long_chat, short_chat):
            seen[r.request_id] |= pools_of(plan, r)
        now += 0.01
    assert seen == {long_chat.request_id: {Pool.MAIN}, short_chat.request_id: {Pool.INTERACTIVE}}
    for r in (long_chat, short_chat):
        assert r.output_tokens == [token_for(r.request_id, r.num_prompt_tokens + k) for k in range(6)]
    assert sched.pools.kv[Pool.MAIN].num_used_cells == 0 and sched.pools.kv[Pool.INTERACTIVE].num_used_cells == 0


def summary_decoding(sched, runner, num_prompt=600):
    summary = create_request(lane="summaries", num_prompt=num_prompt, max_tokens=200)
    sched.add_request(summary)
    now = 0.0
    while not summary.is_decoding:
        step(sched, runner, now)
        now += 0.01
    return summary, now


def test_in_the_main_cache_a_long_chat_preempts_background_above_its_floor():
    sched, runner = two_caches(), FakeRunner()
    summary, now = summary_decoding(sched, runner)
    chat = create_request(lane="chat", num_prompt=500, max_tokens=5, arrival=now)  # 600 + 500 > 1000 cells
    sched.add_request(chat)
    plan, _ = step(sched, runner, now + 0.01)
    assert summary.num_preemptions == 1 and summary.status is Status.WAITING
    assert pools_of(plan, chat) == {Pool.MAIN}
    run_until_idle(sched, runner, now + 0.02)
    assert chat.first_token_time < summary.finish_time and len(chat.output_tokens) == 5
    assert summary.output_tokens == [token_for(summary.request_id, 600 + k) for k in range(200)]


def test_background_at_its_floor_keeps_its_cells_and_the_long_chat_waits_for_them():
    sched, runner = two_caches(background_min_share=0.9), FakeRunner()  # 900 cells kept: the summary holds 800 at most
    summary, now = summary_decoding(sched, runner)
    chat = create_request(lane="chat", num_prompt=500, max_tokens=5, arrival=now)
    sched.add_request(chat)
    run_until_idle(sched, runner, now + 0.01)
    assert summary.num_preemptions == 0 and chat.finished and len(chat.output_tokens) == 5
    assert chat.admitted_time >= summary.finish_time  # its cells came when the summary gave them back


def test_a_short_chat_in_its_own_cache_still_never_preempts_background():
    sched, runner = two_caches(), FakeRunner()
    summary, now = summary_decoding(sched, runner, num_prompt=700)
    chat = create_request(lane="chat", num_prompt=150, max_tokens=5, arrival=now)
    sched.add_request(chat)
    run_until_idle(sched, runner, now + 0.01)
    assert chat.pool is Pool.INTERACTIVE and summary.num_preemptions == 0 and chat.finished
