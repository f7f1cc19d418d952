"""The waiting queues kept per (lane, member) beside each lane's: always the lane's requests, in its order."""

import random

from homeai.sched.queues import WaitingQueues
from homeai.sched.request import Status

from tests.sched.helpers import FakeRunner, create_request, create_scheduler


def _check(queues: WaitingQueues) -> None:
    for lane, queue in queues.lanes.items():
        members = {r.member for r in queue}
        assert set(queues.pairs[lane]) == members, "a pair is listed exactly while it has requests waiting"
        for member, pair in queues.pairs[lane].items():
            assert list(pair) == [r for r in queue if r.member == member], "a pair's queue is its lane's, in order"
        assert sorted(queue, key=queues.place) == list(queue), "places sort as the lane's queue"
        for member in members:
            fresh = [r.num_remaining for r in queue if r.member == member and not r.output_tokens]
            assert queues.shortest_fresh(lane, member) == min(fresh, default=None)


def test_pairs_follow_their_lanes_through_admission_preemption_abort_and_finish():
    rng = random.Random(7)
    sched = create_scheduler(num_cells=600, num_seqs=6, max_step_tokens=64)
    runner = FakeRunner()
    now, live, made = 0.0, [], []
    for step in range(300):
        for _ in range(rng.choice([0, 0, 1, 3])):
            request = create_request(lane=rng.choice(["voice", "chat", "summaries"]),
                                     member=rng.choice(["alice", "bob", "carol"]), num_prompt=rng.choice([4, 40, 200]),
                                     max_tokens=rng.choice([2, 30]), arrival=now)
            sched.add_request(request)
            live.append(request.request_id)
            made.append(request)
        if live and rng.random() < 0.1:
            sched.abort(rng.choice(live), now=now)
        plan = sched.schedule(now)
        _check(sched.queues)
        sched.update(plan, runner.run(plan), now)
        _check(sched.queues)
        now += 0.02
    assert any(r.num_preemptions for r in made), "the load preempted some (requeued at their lane's head)"
    assert any(r.finish_reason == "abort" for r in made) and any(r.finish_reason == "length" for r in made)


def test_a_lane_queued_out_of_arrival_order_is_scanned_until_it_empties():
    queues = WaitingQueues(["chat"])
    first, late, early = (create_request(member="alice", arrival=t) for t in (1.0, 3.0, 2.0))
    queues.append(first)
    queues.append(late)
    assert queues.in_arrival_order("chat")
    queues.append(early)  # arrived before one already queued behind it
    assert not queues.in_arrival_order("chat")
    for request in (first, late, early):
        queues.remove(request)
    assert queues.in_arrival_order("chat"), "an empty lane is in order again"


def test_a_preempted_request_goes_first_in_its_lane_and_its_pair():
    queues = WaitingQueues(["chat"])
    alice, bob = create_request(member="alice"), create_request(member="bob")
    queues.append(alice)
    queues.append(bob)
    back = create_request(member="bob")
    back.num_preemptions, back.status = 1, Status.WAITING
    queues.appendleft(back)
    assert list(queues.lanes["chat"]) == [back, alice, bob]
    assert list(queues.pairs["chat"]["bob"]) == [back, bob]
    assert queues.first([alice, bob, back]) is back
    assert queues.in_arrival_order("chat"), "a preempted request is always eligible: the order holds"


def test_decodes_grow_at_once_only_when_the_free_cells_cover_them_all():
    sched = create_scheduler(num_cells=120, num_seqs=4, max_step_tokens=64)
    runner = FakeRunner()
    requests = [create_request(lane="summaries", num_prompt=29, max_tokens=50, arrival=0.0) for _ in range(4)]
    for request in requests:
        sched.add_request(request)
    now = 1.0
    while not all(r.is_decoding for r in requests):  # 4 x 30 cells: the cache is full
        plan = sched.schedule(now)
        sched.update(plan, runner.run(plan), now)
        now += 0.01
    kv = sched.pools.kv[requests[0].pool]
    assert kv.num_free_cells < len(requests), "the cache cannot give every decode its next cell"
    before = {r.seq_id: kv.length(r.seq_id) for r in requests}
    assert not sched.pools.grow_decodes(requests)
    assert {r.seq_id: kv.length(r.seq_id) for r in requests} == before, "nothing grew"
    plan = sched.schedule(now)  # one at a time instead: the latest admitted give way
    assert any(r.num_preemptions for r in requests) and 0 < len(plan.generating) < len(requests)
    sched.update(plan, runner.run(plan), now)
    running = [r for r in requests if r.seq_id is not None]
    free = kv.num_free_cells
    assert free >= len(running) and sched.pools.grow_decodes(running)
    assert kv.num_free_cells == free - len(running)
    assert all(kv.length(r.seq_id) == r.num_computed_tokens + 1 for r in running)
