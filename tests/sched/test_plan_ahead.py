"""A step settled in two halves (`Scheduler.ahead`, then `settle` once its samples are read), the
next one planned in between, as the engine does with `scheduler.plan_ahead` on: every request
ends with the same output as with `update()`, no placeholder reaches a plan that runs, and an end
of generation found a step late drops that sequence's row from the plan made meanwhile."""

from __future__ import annotations

from homeai.sched.pools import Pool
from homeai.sched.request import Kind, Request, Sample, SamplingParams, Status
from homeai.sched.scheduler import PENDING, StepResult
from tests.sched.helpers import FakeRunner, create_scheduler, token_for

STEP_S = 0.01


class EndingRunner(FakeRunner):
    """The fake model, sampling an end of generation where `ends` says (request id -> position);
    it fails the test if a placeholder token reaches it."""

    def __init__(self, ends: dict[str, int]):
        super().__init__(step_ms=STEP_S * 1000)
        self.ends = ends

    def run(self, plan):
        for item in plan.items:
            assert PENDING not in item.tokens, f"{item.request_id}: a placeholder token reached a step that runs"
        result = super().run(plan)
        for item in plan.generating:
            position = item.start + len(item.tokens)
            if item.sample and self.ends.get(item.request_id) == position:
                result.samples[item.request_id] = Sample(token_for(item.request_id, position), is_eog=True)
        return result


def workload() -> tuple[list[Request], dict[str, int]]:
    """Chats of two members, long background prompts read in chunks, embedding inputs; some
    answers end early with an end of generation, some run to their last token."""
    requests, ends = [], {}
    for i in range(8):
        rid = f"chat{i}"
        prompt = [(i * 37 + k) % 900 + 10 for k in range(20 + 9 * i)]
        requests.append(Request(rid, "chat", "alice" if i % 2 else "bob", prompt, 0.02 * i,
                                params=SamplingParams(max_tokens=12 + 3 * i)))
        if i % 3 == 0:
            ends[rid] = len(prompt) + 4 + i  # its answer's (5 + i)th token ends generation
    for i in range(3):
        rid = f"summary{i}"
        prompt = [(i * 53 + k) % 900 + 10 for k in range(300 + 50 * i)]
        requests.append(Request(rid, "summaries", "carol", prompt, 0.0, params=SamplingParams(max_tokens=20)))
        if i == 1:
            ends[rid] = len(prompt) + 7
    for i in range(4):
        rid = f"embed{i}"
        requests.append(Request(rid, "embeddings", "dave", [(i + k) % 900 + 10 for k in range(40 + 30 * i)], 0.01,
                                kind=Kind.EMBED, params=SamplingParams(max_tokens=1)))
    return requests, ends


def crowded() -> tuple[list[Request], dict[str, int]]:
    """Two summaries decoding in a cache that holds little more, then a chat that needs their room."""
    requests = [Request(f"s{i}", "summaries", "carol", [(k + i) % 900 + 10 for k in range(120)], 0.0,
                        params=SamplingParams(max_tokens=60)) for i in range(2)]
    requests.append(Request("c", "chat", "bob", [(k * 3) % 900 + 10 for k in range(100)], 0.5,
                            params=SamplingParams(max_tokens=10)))
    return requests, {}


def run_plain(num_cells: int, make=workload) -> dict[str, Request]:
    sched = create_scheduler(num_cells=num_cells, max_step_tokens=96)
    requests, ends = make()
    runner, now, pending = EndingRunner(ends), 0.0, sorted(requests, key=lambda r: r.arrival_time)
    for _ in range(5000):
        while pending and pending[0].arrival_time <= now:
            sched.add_request(pending.pop(0))
        if not pending and not sched.has_work():
            return {r.request_id: r for r in requests}
        plan = sched.schedule(now)
        sched.update(plan, runner.run(plan), now + STEP_S)
        now += STEP_S
    raise AssertionError("the plain loop did not drain")


def run_ahead(num_cells: int, make=workload, as_engine: bool = False) -> tuple[dict[str, Request], int, int, int]:
    """Every step's successor planned before its samples are settled (`as_engine`: only when it will
    hold decodes alone, and planned again if a request came meanwhile, as the engine's
    `Engine._loop` does when it plans ahead); with the fake runner. Returns the requests, how many rows an end found a
    step late dropped from the plan made meanwhile, how many sequences that plan preempted
    while their token was pending, and how many steps were planned ahead."""
    sched = create_scheduler(num_cells=num_cells, max_step_tokens=96)
    requests, ends = make()
    runner, now, waiting = EndingRunner(ends), 0.0, sorted(requests, key=lambda r: r.arrival_time)
    plan, dropped, preempted, planned_ahead = None, 0, 0, 0
    for _ in range(5000):
        while waiting and waiting[0].arrival_time <= now:
            sched.add_request(waiting.pop(0))
        if plan is None:
            if not waiting and not sched.has_work():
                return {r.request_id: r for r in requests}, dropped, preempted, planned_ahead
            plan = sched.schedule(now)
        else:
            sched.prune(plan)
            if as_engine and any(sched.waiting.values()):
                plan = sched.replan(plan, now)
        result = runner.run(plan)
        if plan.empty:
            sched.update(plan, result, now + STEP_S)
            plan = None
        else:
            pending = sched.ahead(plan, now)
            if as_engine and not sched.only_decoding():
                sched.settle(plan, pending, result, now + STEP_S, None)
                plan = None
                now += STEP_S
                continue
            next_plan = sched.schedule(now)
            planned_ahead += 1
            preempted += sum(p.request.status is Status.WAITING for p in pending)
            planned = sum(len(b) for b in next_plan.batches.values())
            sched.settle(plan, pending, result, now + STEP_S, next_plan)
            dropped += planned - sum(len(b) for b in next_plan.batches.values())
            plan = None if next_plan.idle else next_plan
        now += STEP_S
    raise AssertionError("the plan-ahead loop did not drain")


def test_every_request_ends_with_the_same_output_planned_ahead_as_not():
    for num_cells, as_engine in ((4096, False), (550, False), (4096, True), (550, True)):  # and a cache that preempts
        plain = run_plain(num_cells)
        ahead, dropped, _, planned_ahead = run_ahead(num_cells, as_engine=as_engine)
        assert set(plain) == set(ahead)
        for rid, request in ahead.items():
            assert request.status is Status.FINISHED, rid
            assert request.finish_reason == plain[rid].finish_reason, rid
            assert request.output_tokens == plain[rid].output_tokens, rid
            assert PENDING not in request.output_tokens
            assert request.embedding == plain[rid].embedding, rid
        assert planned_ahead > 0
        if not as_engine:  # (the engine plans ahead only while nothing waits: rarely here)
            assert dropped > 0, "no end of generation was found a step late: the test missed its point"


def test_preempted_while_its_token_is_pending_it_resumes_with_the_token():
    plain = run_plain(300, crowded)
    ahead, _, preempted, _ = run_ahead(300, crowded)
    assert preempted > 0, "no sequence was preempted with its token pending: the test missed its point"
    for rid, request in ahead.items():
        assert (request.finish_reason, request.output_tokens) == (plain[rid].finish_reason, plain[rid].output_tokens), rid


def test_settling_ahead_charges_and_times_as_update_does():
    """One step, settled by update() on one scheduler and by ahead() + settle() on another: the
    same tokens, fair share counters, token times; an end of generation is not charged."""
    scheds = [create_scheduler(), create_scheduler()]
    for sched in scheds:
        for rid, n in (("a", 12), ("b", 30)):
            sched.add_request(Request(rid, "chat", rid, list(range(10, 10 + n)), 0.0,
                                      params=SamplingParams(max_tokens=5)))
    plain, ahead = scheds
    for now in (0.0, 0.01, 0.02):
        plan = plain.schedule(now)
        result = StepResult(samples={i.request_id: Sample(100 + i.start, is_eog=i.request_id == "b" and now == 0.02)
                                     for i in plan.generating if i.sample}, elapsed_ms=10.0)
        plain.update(plan, result, now + 0.01)
        plan = ahead.schedule(now)
        pending = ahead.ahead(plan, now)
        assert all(p.request.output_tokens[-1] == PENDING for p in pending)
        ahead.settle(plan, pending, result, now + 0.01, None)
    assert ahead.fair.counters == plain.fair.counters
    for rid in ("a", "b"):
        p, a = plain.requests.get(rid), ahead.requests.get(rid)
        if p is None:
            assert a is None  # "b" ended (stop) in both
            continue
        assert a.output_tokens == p.output_tokens
        assert (a.first_token_time, a.itls, a.num_computed_tokens) == (p.first_token_time, p.itls, p.num_computed_tokens)


def test_an_end_found_late_drops_the_row_planned_meanwhile():
    sched = create_scheduler()
    sched.add_request(Request("x", "chat", "m", list(range(10, 30)), 0.0, params=SamplingParams(max_tokens=50)))
    plan = sched.schedule(0.0)
    pending = sched.ahead(plan, 0.0)
    next_plan = sched.schedule(0.0)
    assert [i.tokens for i in next_plan.batches[Pool.INTERACTIVE] + next_plan.batches[Pool.MAIN]] == [[PENDING]]
    outputs = sched.settle(plan, pending, StepResult(samples={"x": Sample(7, is_eog=True)}), 0.01, next_plan)
    assert next_plan.empty
    assert [(o.request.request_id, o.sample, o.finished) for o in outputs] == [("x", None, True)]
    assert sched.requests.get("x") is None and not sched.running


def test_aborted_while_its_token_is_pending_it_keeps_no_placeholder_and_no_charge():
    sched = create_scheduler()
    sched.add_request(Request("x", "chat", "m", list(range(10, 30)), 0.0, params=SamplingParams(max_tokens=50)))
    plan = sched.schedule(0.0)
    sched.update(plan, StepResult(samples={"x": Sample(7)}), 0.01)
    charged = dict(sched.fair.counters)
    request = sched.requests["x"]
    plan = sched.schedule(0.02)
    pending = sched.ahead(plan, 0.02)
    assert request.output_tokens == [7, PENDING]
    sched.abort("x")
    assert request.output_tokens == [7] and sched.fair.counters == charged
    assert sched.settle(plan, pending, StepResult(samples={"x": Sample(8)}), 0.03, None) == []
    assert request.output_tokens == [7]


def test_a_plan_made_ahead_is_made_again_when_a_request_comes_and_keeps_its_cache_operations():
    sched = create_scheduler(max_step_ms=1000.0)  # (both prompts read in the first step)
    sched.add_request(Request("x", "chat", "m", list(range(10, 30)), 0.0, params=SamplingParams(max_tokens=50)))
    sched.add_request(Request("y", "chat", "n", list(range(40, 60)), 0.0, params=SamplingParams(max_tokens=3)))
    plan = sched.schedule(0.0)
    sched.update(plan, StepResult(samples={"x": Sample(7), "y": Sample(8)}), 0.01)
    plan = sched.schedule(0.01)
    sched.update(plan, StepResult(samples={"x": Sample(7), "y": Sample(8)}), 0.02)
    plan = sched.schedule(0.02)
    pending = sched.ahead(plan, 0.02)  # "y" ends here, at its last token: its cells go
    assert sched.only_decoding()
    ahead = sched.schedule(0.02)
    assert ahead.cache_ops and ahead.done == ["y"]
    sched.settle(plan, pending, StepResult(samples={"x": Sample(9), "y": Sample(9)}), 0.03, ahead)
    sched.add_request(Request("z", "chat", "o", list(range(70, 90)), 0.0, params=SamplingParams(max_tokens=5)))
    assert not sched.only_decoding()
    again = sched.replan(ahead, 0.03)
    assert {i.request_id for i in again.items} == {"x", "z"}, "the newcomer waits no longer than in the plain loop"
    assert again.done[:1] == ["y"] and all(again.cache_ops[p][:len(ops)] == ops for p, ops in ahead.cache_ops.items())
    assert [i.tokens for i in again.items if i.request_id == "x"] == [[9]]
