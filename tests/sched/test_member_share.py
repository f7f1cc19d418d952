"""A member's share of the interactive readers (`homeai/sched/members.py`): one member's flood of
chats (or of voice requests, which go first) never keeps another member's chat out for long, a
preempted answer comes out the same, waiting members take turns, and a lone member still uses
every reader."""

from __future__ import annotations

from dataclasses import replace

import pytest

from homeai.sched.pacing import PaceTuning
from homeai.sched.request import Status
from tests.sched.helpers import (FakeRunner, cpu_ms, create_request, create_scheduler, run_until_idle, step,
                                 taught, token_for)


def flooded(share=0.5, interactive_cells=8192, num_seqs=32, flood=30, max_tokens=300, warm_steps=150, lane="chat"):
    """alice's `flood` requests on `lane`, running and waiting at their readers' pace after `warm_steps` steps."""
    sched = taught(create_scheduler(num_cells=8192, num_seqs=num_seqs, interactive_cells=interactive_cells,
                                    member_seq_share=share), cpu_ms)
    runner = FakeRunner(cost=cpu_ms)
    alice = [create_request(lane=lane, member="alice", num_prompt=30, max_tokens=max_tokens) for _ in range(flood)]
    for r in alice:
        sched.add_request(r)
    now = 0.0
    for _ in range(warm_steps):
        now = advance(sched, runner, now)
    return sched, runner, alice, now


def advance(sched, runner, now):
    plan, _ = step(sched, runner, now)
    return now + cpu_ms(plan.shape) / 1000.0


def steps_until(sched, runner, now, done, limit=2000):
    for n in range(limit):
        if done():
            return n, now
        now = advance(sched, runner, now)
    raise AssertionError(f"not within {limit} steps")


@pytest.mark.parametrize("interactive_cells, lane", [(8192, "chat"), (0, "chat"), (8192, "voice")])
def test_a_member_arriving_beside_a_flood_gets_a_reader_at_once(interactive_cells, lane):
    """alice floods chat (or voice: its readers go first, and would keep every chat out)."""
    sched, runner, alice, now = flooded(interactive_cells=interactive_cells, lane=lane)
    assert sched.num_waiting(lane) > 0, "the readers' pace holds part of alice's flood back"
    readers = len(sched.running)
    bob = create_request(lane="chat", member="bob", num_prompt=40, max_tokens=20, arrival=now)
    sched.add_request(bob)
    admitted, now = steps_until(sched, runner, now, lambda: bob.status is Status.RUNNING)
    assert admitted <= 2, "bob waits a step or two, not for alice's answers to end"
    preempted = [r for r in alice if r.num_preemptions]
    assert preempted and len(sched.running) <= readers, "alice's newest gave way: the readers stay at their pace"
    newest = [r for r in sched.running if r.member == "alice"][-1]
    assert all(p.admitted_time >= newest.admitted_time for p in preempted)
    first, now = steps_until(sched, runner, now, lambda: bool(bob.output_tokens))
    queued = [r for r in alice if r.admitted_time is None]
    assert queued, "bob's first token comes before most of alice's queue is even let in"


@pytest.mark.parametrize("lane", ["chat", "voice"])
def test_without_a_share_the_newcomer_waits_for_the_flood(lane):
    """The control: with every reader open to one member (share 1), bob waits for alice's answers to end."""
    sched, runner, alice, now = flooded(share=1.0, lane=lane)
    bob = create_request(lane="chat", member="bob", num_prompt=40, max_tokens=20, arrival=now)
    sched.add_request(bob)
    admitted, _ = steps_until(sched, runner, now, lambda: bob.status is Status.RUNNING)
    assert admitted > 20 and not any(r.num_preemptions for r in alice)


def test_the_preempted_answers_come_out_the_same():
    sched, runner, alice, now = flooded(flood=16, max_tokens=80, warm_steps=40)
    bobs = [create_request(lane="chat", member="bob", num_prompt=40, max_tokens=30, arrival=now) for _ in range(3)]
    for r in bobs:
        sched.add_request(r)
    run_until_idle(sched, runner, now)
    preempted = [r for r in alice if r.num_preemptions]
    assert preempted, "alice gave way to bob"
    for r in alice + bobs:
        assert r.finish_reason == "length"
        assert r.output_tokens == [token_for(r.request_id, r.num_prompt_tokens + k) for k in range(r.max_tokens)]


def test_a_member_holds_at_most_its_share_while_another_waits():
    """bob asks for as many as alice: each ends up with half the readers, not alice's head start."""
    sched, runner, alice, now = flooded(flood=20)
    bobs = [create_request(lane="chat", member="bob", num_prompt=30, max_tokens=300, arrival=now) for _ in range(20)]
    for r in bobs:
        sched.add_request(r)
    for _ in range(20):
        now = advance(sched, runner, now)
    held = {m: sum(1 for r in sched.running if r.member == m) for m in ("alice", "bob")}
    assert abs(held["alice"] - held["bob"]) <= 1, held


def test_waiting_members_take_fair_turns():
    """Three members' queues, one sequence id freed at a time: they are let in in turns."""
    sched, runner = create_scheduler(num_seqs=3), FakeRunner()
    for member in ("alice", "bob", "carol"):
        for _ in range(6):
            sched.add_request(create_request(lane="chat", member=member, num_prompt=20, max_tokens=6))
    requests = list(sched.requests.values())
    run_until_idle(sched, runner)
    order = [r.member for r in sorted(requests, key=lambda r: (r.admitted_time, r.request_id))]
    for i in range(0, len(order), 3):
        assert sorted(order[i:i + 3]) == ["alice", "bob", "carol"], order


def test_a_newcomer_goes_before_a_busy_members_queue():
    """alice holds every sequence id and more of hers wait: bob's one request goes next, ahead of
    her queue, and one of hers gives way for it."""
    sched, runner = create_scheduler(num_seqs=4), FakeRunner()
    alice = [create_request(lane="chat", member="alice", num_prompt=20, max_tokens=40) for _ in range(10)]
    for r in alice:
        sched.add_request(r)
    now = 0.0
    for _ in range(10):
        now = advance(sched, runner, now)
    assert len(sched.running) == 4 and sched.num_waiting("chat") == 6
    bob = create_request(lane="chat", member="bob", num_prompt=20, max_tokens=5, arrival=now)
    sched.add_request(bob)
    admitted, now = steps_until(sched, runner, now + 0.01, lambda: bob.status is Status.RUNNING)
    assert admitted <= 1 and sum(r.num_preemptions for r in alice) == 1
    assert [r for r in sched.running if r.member == "alice"] and sched.num_waiting("chat") == 7


def test_a_lone_member_uses_every_reader():
    capped, runner, alice, _ = flooded(share=0.5)
    uncapped, _, _, _ = flooded(share=1.0)
    assert len(capped.running) == len(uncapped.running) > 2
    assert not any(r.num_preemptions for r in alice)


def test_a_members_long_answers_filling_the_cache_preempt_her_own_newest_not_another_members():
    """alice's answers grow past the interactive cache: her own newest gives way, never bob's
    chat, which was admitted last (the pool's own rule would pick it)."""
    for share, bob_preempted in ((0.5, False), (1.0, True)):
        sched, runner, alice, now = flooded(share=share, interactive_cells=1500, flood=8, warm_steps=30)
        assert sched.num_waiting("chat") == 0
        bob = create_request(lane="chat", member="bob", num_prompt=40, max_tokens=250, arrival=now)
        sched.add_request(bob)
        run_until_idle(sched, runner, now)
        assert bob.finished and all(r.finished for r in alice)
        assert bool(bob.num_preemptions) is bob_preempted, share
        expected = [token_for(bob.request_id, 40 + k) for k in range(250)]
        assert bob.output_tokens == expected


def test_on_a_fair_share_tie_the_member_holding_fewer_goes_first():
    """With no cap at all (share 1), a newcomer lifted to the busy member's counter still goes
    first on the tie: it holds nothing."""
    sched, runner = create_scheduler(num_seqs=4, member_seq_share=1.0), FakeRunner()
    alice = [create_request(lane="chat", member="alice", num_prompt=20, max_tokens=5 if i == 0 else 40)
             for i in range(10)]
    for r in alice:
        sched.add_request(r)
    now = 0.0
    while not alice[0].finished:
        now = advance(sched, runner, now)
    bob = create_request(lane="chat", member="bob", num_prompt=20, max_tokens=5, arrival=now - 0.01)
    sched.add_request(bob)
    advance(sched, runner, now)
    assert bob.status is Status.RUNNING and sched.num_waiting("chat") == 6  # all of them alice's


def test_a_member_served_more_earlier_still_gets_a_reader_beside_a_flood():
    """bob was served more than alice in the lane (a higher fair-share counter: alice trickled
    beside his burst); then alice floods it. bob's chat still gets a reader at once: alice's
    preempted answer does not take the slot straight back on her lower counter."""
    sched = taught(create_scheduler(num_cells=8192, num_seqs=32, interactive_cells=8192), cpu_ms)
    runner = FakeRunner(cost=cpu_ms)
    trickle = create_request(lane="chat", member="alice", num_prompt=30, max_tokens=3000)
    burst = [create_request(lane="chat", member="bob", num_prompt=200, max_tokens=300) for _ in range(8)]
    for r in [trickle, *burst]:
        sched.add_request(r)
    now = 0.0
    while not all(r.finished for r in burst):
        now = advance(sched, runner, now)
    alice = [create_request(lane="chat", member="alice", num_prompt=30, max_tokens=300, arrival=now)
             for _ in range(30)]
    for r in alice:
        sched.add_request(r)
    for _ in range(100):
        now = advance(sched, runner, now)
    assert sched.fair.counter(("chat", "bob")) > sched.fair.counter(("chat", "alice"))
    assert sched.num_waiting("chat") > 0
    bob = create_request(lane="chat", member="bob", num_prompt=40, max_tokens=20, arrival=now)
    sched.add_request(bob)
    admitted, now = steps_until(sched, runner, now, lambda: bob.status is Status.RUNNING)
    assert admitted <= 2
    assert sum(r.num_preemptions for r in alice) <= 3, "no member's answer goes back and forth"


def test_a_member_who_used_the_lane_alone_is_not_owed_it_by_a_newcomer():
    """bob used the lane alone and left; alice comes after: she starts level with him, not with
    all he was served as credit (else her flood's prefills would take every turn before his next chat)."""
    sched, runner = create_scheduler(), FakeRunner()
    for _ in range(4):
        sched.add_request(create_request(lane="chat", member="bob", num_prompt=100, max_tokens=50))
    now = run_until_idle(sched, runner)
    bob = sched.fair.counter(("chat", "bob"))
    assert bob > 0
    sched.add_request(create_request(lane="chat", member="alice", num_prompt=20, max_tokens=5, arrival=now))
    step(sched, runner, now)
    assert sched.fair.counter(("chat", "alice")) >= bob


def _first_token_steps(first_read=None, num_prompt=40):
    sched, runner, alice, now = flooded()
    if first_read is not None:
        sched.pacing.tuning = replace(sched.pacing.tuning, first_read=first_read)
    bob = create_request(lane="chat", member="bob", num_prompt=num_prompt, max_tokens=20, arrival=now)
    sched.add_request(bob)
    longest = 0.0
    for n in range(2000):
        if bob.output_tokens:
            return n, longest
        plan, _ = step(sched, runner, now)
        longest = max(longest, cpu_ms(plan.shape))
        now += cpu_ms(plan.shape) / 1000.0
    raise AssertionError("bob's first token did not come")


def test_a_members_short_question_is_read_in_longer_steps_beside_anothers_readers():
    """Beside alice's readers at their pace, bob's question would be read a few tokens a step; a
    step that reads a member's first question may run up to `first_read` times the pace."""
    pace = 100.0  # the chat lane's inter-token target: cpu_ms keeps it
    steps, longest = _first_token_steps()
    control, control_longest = _first_token_steps(first_read=1.0)
    assert steps < control / 2, (steps, control)
    assert control_longest <= pace < longest <= PaceTuning().first_read * pace * 1.05


def test_a_long_first_question_is_read_at_the_readers_pace():
    """A long prompt gains little from longer steps and would slow every reader for many: it is
    read at the pace until its rest fits in `first_read_steps` longer steps."""
    steps, _ = _first_token_steps(num_prompt=1500)
    control, _ = _first_token_steps(first_read=1.0, num_prompt=1500)
    assert control - steps <= PaceTuning().first_read_steps + 1, (steps, control)
