"""The scheduler's accounting settles from what ran: fair share and background's credit move only
in `update()` for a step that ran, never for one that found no KV slot or failed; and background
keeps its floor of cells whenever a sequence is preempted for interactive work.

Run: .venv/bin/python -m pytest -q tests/sched/test_accounting.py
"""

from __future__ import annotations

from homeai.sched.request import Status
from homeai.sched.scheduler import StepResult
from tests.sched.helpers import FakeRunner, create_request, create_scheduler, step


def _forget(runner: FakeRunner, plan) -> None:
    """The fake model forgets what llama.cpp rolled back (a step that found no slot keeps nothing)."""
    for pool, items in plan.batches.items():
        for item in items:
            if item.start == 0:
                runner.positions.pop((pool, item.seq_id), None)
            else:
                runner.positions[pool, item.seq_id] = item.start


def test_a_step_that_found_no_kv_slot_charges_no_fair_share():
    sched, runner = create_scheduler(max_step_ms=1000.0), FakeRunner()  # (its prompt read in one step)
    chat = create_request(lane="chat", member="alice", num_prompt=40, max_tokens=4)
    sched.add_request(chat)
    plan = sched.schedule(0.0)
    assert [i.request_id for i in plan.items] == [chat.request_id]
    sched.update(plan, StepResult(no_kv_slot=True), 0.01)
    assert sched.fair.counter(chat.key) == 0.0, "charged for a prompt chunk that never ran"
    _forget(runner, plan)
    step(sched, runner, 0.02)  # it runs now: charged once, for its prompt and its first token
    weight = sched.policies["chat"].weight
    assert sched.fair.counter(chat.key) == (40 * sched.fair.w_in + sched.fair.w_out) / weight


def test_a_step_that_found_no_kv_slot_moves_no_background_credit():
    sched, runner = create_scheduler(max_step_tokens=64), FakeRunner()
    sched.add_request(create_request(lane="summaries", member="docs", num_prompt=2000, max_tokens=4))
    now = 0.0
    for i in range(40):  # chats keep interactive work there beside the document
        if sched.num_waiting("chat") < 2:
            sched.add_request(create_request(lane="chat", member=f"m{i % 3}", num_prompt=30, max_tokens=40,
                                             arrival=now))
        step(sched, runner, now)
        now += 0.01
    sched.share.credit = credit = 5.0  # background is owed a few tokens
    plan = sched.schedule(now)
    sched.update(plan, StepResult(no_kv_slot=True), now + 0.01)
    assert sched.share.credit == credit, "background's credit moved for a step that never ran"
    _forget(runner, plan)
    step(sched, runner, now + 0.02)
    assert sched.share.credit != credit, "the test needs a step that moves the credit when it runs"


def test_a_failed_step_charges_no_fair_share_and_moves_no_background_credit():
    sched, runner = create_scheduler(max_step_tokens=64), FakeRunner()
    background = create_request(lane="summaries", member="docs", num_prompt=2000, max_tokens=4)
    sched.add_request(background)
    chat = create_request(lane="chat", member="alice", num_prompt=200, max_tokens=4, arrival=0.0)
    sched.add_request(chat)
    step(sched, runner, 1.0)
    counters, credit = dict(sched.fair.counters), sched.share.credit
    plan = sched.schedule(1.01)
    assert plan.background is not None and plan.background.owed != plan.background.got
    failed = {r.request_id for r in sched.fail(plan, 1.02)}
    assert failed == {i.request_id for i in plan.items} and chat.request_id in failed
    assert chat.finish_reason == "error"
    assert sched.fair.counters == counters and sched.share.credit == credit


def test_a_growing_chat_never_preempts_background_below_its_floor():
    """One cache for every lane: a chat's answer grows until the cache is full. Background holds
    one short sequence, within its minimum share: the chat gives way, not the document."""
    sched, runner = create_scheduler(num_cells=1024, num_seqs=16, max_step_tokens=256), FakeRunner()
    document = create_request(lane="summaries", member="docs", num_prompt=20, max_tokens=70)
    sched.add_request(document)
    now = 1.0
    while not document.is_decoding:
        step(sched, runner, now)
        now += 0.01
    chat = create_request(lane="chat", member="alice", num_prompt=900, max_tokens=120, arrival=now)
    sched.add_request(chat)
    for _ in range(1000):
        if not sched.has_work():
            break
        assert document.finished or not sched.share.may_preempt(), "the test needs background within its floor"
        step(sched, runner, now)
        now += 0.01
        assert document.num_preemptions == 0, "background was preempted below its floor for a chat"
    assert chat.num_preemptions > 0, "the chat never needed the document's cells"
    assert document.finished and chat.finished and len(chat.output_tokens) == 120


def test_after_no_kv_slot_an_interactive_sequence_gives_way_before_background_at_its_floor():
    sched, runner = create_scheduler(), FakeRunner()
    document = create_request(lane="summaries", member="docs", num_prompt=30, max_tokens=40)
    chat = create_request(lane="chat", member="alice", num_prompt=30, max_tokens=40)
    sched.add_request(document)
    sched.add_request(chat)
    now = 1.0
    while not (document.is_decoding and chat.is_decoding):
        step(sched, runner, now)
        now += 0.01
    assert not sched.share.may_preempt()
    plan = sched.schedule(now)
    sched.update(plan, StepResult(no_kv_slot=True), now + 0.01)
    assert document.status is Status.RUNNING and document.num_preemptions == 0
    assert chat.status is Status.WAITING and chat.num_preemptions == 1
