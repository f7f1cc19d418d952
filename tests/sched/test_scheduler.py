"""The pure scheduler against a scripted fake runner: budgets, priority, fairness, KV, abort."""

from __future__ import annotations

import pytest

from homeai.sched.costmodel import StepCostModel, StepShape
from homeai.sched.pools import Drop, Pool
from homeai.sched.request import Kind, Status
from homeai.sched.pacing import PaceTuning
from homeai.sched.scheduler import QueueFull
from tests.sched.helpers import (FakeRunner, create_request, create_scheduler, run_until_idle, step,
                                 token_for)
from tests.sched.helpers import cpu_ms as _cpu, taught as _taught


def test_chunked_prefill_stays_within_budget_and_never_skips_a_decode():
    sched, runner = create_scheduler(max_step_tokens=64), FakeRunner()
    for i in range(6):
        sched.add_request(create_request(num_prompt=10, max_tokens=40, member=f"m{i}"))
    for _ in range(3):
        step(sched, runner, 0.0)
    for i in range(3):
        sched.add_request(create_request(lane="summaries", num_prompt=700, max_tokens=5, member=f"b{i}"))
    now = 0.0
    while sched.has_work():
        decoding = {r.request_id for r in sched.running if r.is_decoding}
        plan, _ = step(sched, runner, now)
        now += 0.01
        assert plan.num_tokens <= plan.budget <= 64
        planned = {i.request_id for i in plan.items}
        assert decoding <= planned, "a decoding sequence was skipped for a prefill"
    chunks = [len(i.tokens) for p in runner.plans for i in p.items if len(i.tokens) > 1]
    assert max(chunks) < 700, "the long prompts were not cut into chunks"


def test_interactive_is_admitted_before_queued_background():
    sched, runner = create_scheduler(num_seqs=1), FakeRunner()
    background = create_request(lane="summaries", num_prompt=32, arrival=0.0)
    chat = create_request(lane="chat", num_prompt=32, arrival=0.5)
    sched.add_request(background)
    sched.add_request(chat)
    plan, _ = step(sched, runner, 1.0)
    assert [i.request_id for i in plan.items] == [chat.request_id]
    assert background.status is Status.WAITING


def test_interactive_prefill_goes_first_in_a_step():
    sched, runner = create_scheduler(), FakeRunner()
    background = create_request(lane="summaries", num_prompt=100, arrival=0.0)
    chat = create_request(lane="chat", num_prompt=30, arrival=0.5)
    sched.add_request(background)
    sched.add_request(chat)
    plan, _ = step(sched, runner, 1.0)
    chunks = {i.request_id: len(i.tokens) for i in plan.items}
    assert chunks[chat.request_id] == 30, "the chat's whole prompt goes in the first step"
    assert chunks.get(background.request_id, 0) <= plan.budget - 30


def token_shares(sched, runner, members, steps, now=0.0):
    served = {m: 0.0 for m in members}
    for _ in range(steps):
        plan, outputs = step(sched, runner, now)
        now += 0.01
        for item in plan.items:
            member = sched.requests[item.request_id].member if item.request_id in sched.requests else None
            if member is None:
                member = next(o.request.member for o in outputs if o.request.request_id == item.request_id)
            served[member] += len(item.tokens)
    total = sum(served.values())
    return {m: served[m] / total for m in members}


def test_two_members_flooding_one_lane_get_fair_shares():
    sched, runner = create_scheduler(max_step_tokens=64, num_seqs=4), FakeRunner()
    policy = sched.policies["chat"]
    sched.policies["chat"] = type(policy)(**{**policy.__dict__, "max_queue": 1000})
    for i in range(600):  # both stay backlogged; heavy queues four times as much
        sched.add_request(create_request(member="heavy", num_prompt=48, max_tokens=4, arrival=0.0))
        if i % 4 == 0:
            sched.add_request(create_request(member="light", num_prompt=48, max_tokens=4, arrival=0.0))
    shares = token_shares(sched, runner, ["heavy", "light"], steps=150)
    assert abs(shares["heavy"] - 0.5) < 0.1, shares
    bound = 2 * (48 * 1.0 + 4 * 2.0) / policy.weight
    gap = abs(sched.fair.counter(("chat", "heavy")) - sched.fair.counter(("chat", "light")))
    assert gap <= bound, (gap, bound)


def test_weights_set_the_shares():
    sched, runner = create_scheduler(max_step_tokens=64, num_seqs=4), FakeRunner()
    for lane in ("summaries", "indexing"):
        p = sched.policies[lane]
        sched.policies[lane] = type(p)(**{**p.__dict__, "weight": 3.0 if lane == "summaries" else 1.0})
    for _ in range(120):
        sched.add_request(create_request(lane="summaries", member="a", num_prompt=40, max_tokens=2))
        sched.add_request(create_request(lane="indexing", member="a", num_prompt=40, max_tokens=2,
                                         kind=Kind.GENERATE))
    served = {"summaries": 0, "indexing": 0}
    now = 1.0
    for _ in range(120):
        plan, outputs = step(sched, runner, now)
        now += 0.01
        lanes = {o.request.request_id: o.request.lane for o in outputs}
        for item in plan.items:
            req = sched.requests.get(item.request_id)
            served[req.lane if req else lanes[item.request_id]] += len(item.tokens)
    share = served["summaries"] / sum(served.values())
    assert abs(share - 0.75) < 0.1, served


@pytest.mark.parametrize("interactive_cells", [0, 2048], ids=["one-cache", "interactive-cache"])
def test_background_progresses_under_saturating_interactive_load(interactive_cells):
    sched = create_scheduler(max_step_tokens=64, num_seqs=8, interactive_cells=interactive_cells)
    runner = FakeRunner()
    background = create_request(lane="summaries", num_prompt=300, max_tokens=5, arrival=0.0)
    sched.add_request(background)
    now = 0.0
    for i in range(400):
        if sched.num_waiting("chat") < 4:
            sched.add_request(create_request(lane="chat", member=f"m{i % 3}", num_prompt=40,
                                             max_tokens=30, arrival=now))
        step(sched, runner, now)
        now += 0.01
        if background.finished:
            break
    assert background.finished and background.finish_reason == "length"
    assert len(background.output_tokens) == 5


def test_preemption_frees_cells_and_the_request_finishes_with_the_same_output():
    # A 250 ms step bound lets the chat's 100-token prompt go in one step.
    sched, runner = create_scheduler(num_cells=200, num_seqs=4, max_step_ms=250.0), FakeRunner()
    background = create_request(lane="summaries", num_prompt=120, max_tokens=30, arrival=0.0)
    sched.add_request(background)
    now = 0.0
    while len(background.output_tokens) < 10:
        step(sched, runner, now)
        now += 0.01
    used_before, background_seq = sched.pools.kv[Pool.MAIN].num_used_cells, background.seq_id
    chat = create_request(lane="chat", num_prompt=100, max_tokens=5, arrival=now)
    sched.add_request(chat)
    now += 0.01  # past the chat lane's busy window
    plan, _ = step(sched, runner, now)
    assert background.num_preemptions == 1 and background.status is Status.WAITING
    assert plan.cache_ops[Pool.MAIN] == [Drop(background_seq)] and used_before == 129  # its sequence is released this step
    assert sched.pools.kv[Pool.MAIN].num_used_cells == chat.num_computed_tokens == 100
    run_until_idle(sched, runner, now)
    assert chat.finished and background.finished
    expected = [token_for(background.request_id, 120 + k) for k in range(30)]
    assert background.output_tokens == expected, "tokens were lost or repeated across preemption"
    assert sched.pools.kv[Pool.MAIN].num_used_cells == 0 and len(sched.pools.kv[Pool.MAIN].free_seq_ids) == 4


def test_abort_frees_the_sequence_within_one_step():
    sched, runner = create_scheduler(), FakeRunner()
    request = create_request(num_prompt=20, max_tokens=100)
    sched.add_request(request)
    step(sched, runner, 0.0)
    seq = request.seq_id
    assert seq is not None
    sched.abort(request.request_id, now=0.02)
    plan, _ = step(sched, runner, 0.02)
    assert plan.cache_ops[Pool.MAIN] == [Drop(seq)] and request.request_id in plan.done
    assert request.finish_reason == "abort" and sched.pools.kv[Pool.MAIN].num_used_cells == 0
    assert not plan.items


def test_abort_of_a_waiting_request_removes_it_from_its_queue():
    sched = create_scheduler()
    request = create_request()
    sched.add_request(request)
    sched.abort(request.request_id)
    assert sched.num_waiting("chat") == 0 and not sched.has_work()


def test_full_queue_is_refused_and_unknown_lane_named():
    sched = create_scheduler()
    max_queue = sched.policies["voice"].max_queue
    for _ in range(max_queue):
        sched.add_request(create_request(lane="voice"))
    with pytest.raises(QueueFull, match="voice"):
        sched.add_request(create_request(lane="voice"))
    sched.add_request(create_request(lane="chat"))  # other lanes still take work
    with pytest.raises(ValueError, match="unknown lane 'karaoke'"):
        sched.add_request(create_request(lane="karaoke"))


def test_background_waits_for_its_window_or_a_full_batch():
    sched, runner = create_scheduler(max_step_ms=2000.0), FakeRunner()
    window = sched.policies["embeddings"].window_ms / 1000
    first = create_request(lane="embeddings", num_prompt=8, kind=Kind.EMBED, arrival=0.0)
    sched.add_request(first)
    plan, _ = step(sched, runner, 0.0)
    assert plan.empty and sched.next_wakeup(0.0) == pytest.approx(window)
    plan, _ = step(sched, runner, window)
    assert [i.request_id for i in plan.batches[Pool.EMBED]] == [first.request_id]
    max_batch = sched.policies["embeddings"].max_batch
    batch = [create_request(lane="embeddings", num_prompt=8, kind=Kind.EMBED, arrival=1.0)
             for _ in range(max_batch)]
    for r in batch:
        sched.add_request(r)
    plan, _ = step(sched, runner, 1.0)
    assert len(plan.batches[Pool.EMBED]) == min(max_batch, sched.limits.embed_max_seqs)


def test_interactive_admits_at_once_when_idle():
    sched, runner = create_scheduler(), FakeRunner()
    chat = create_request(lane="chat", arrival=5.0)
    sched.add_request(chat)
    plan, _ = step(sched, runner, 5.0)
    assert plan.items and plan.items[0].request_id == chat.request_id


def test_embeddings_larger_than_a_step_are_chunked_and_pooled_over_every_token():
    sched, runner = create_scheduler(max_step_tokens=64), FakeRunner()
    reqs = [create_request(lane="embeddings", num_prompt=n, kind=Kind.EMBED) for n in (5, 50, 300)]
    for r in reqs:
        sched.add_request(r)
    run_until_idle(sched, runner)
    assert [r.embedding for r in reqs] == [[5.0], [50.0], [300.0]]
    assert max(p.num_tokens for p in runner.plans) <= 64, "no step carries more than its budget"
    step(sched, runner, 99.0)  # the last release goes out with the next plan
    assert not sched.pools.kv[Pool.EMBED].allocated, "every input's cells were released"
    assert not runner.holds(Pool.EMBED)


def test_an_aborted_embedding_in_flight_releases_its_cells():
    sched, runner = create_scheduler(max_step_tokens=32), FakeRunner()
    embed = create_request(lane="embeddings", num_prompt=200, kind=Kind.EMBED)
    sched.add_request(embed)
    step(sched, runner, 1.0)  # past the lane's batching window
    assert 0 < embed.num_computed_tokens < 200 and sched.pools.kv[Pool.EMBED].allocated
    sched.abort(embed.request_id)
    plan, _ = step(sched, runner, 1.1)
    assert plan.cache_ops[Pool.EMBED] and not sched.pools.kv[Pool.EMBED].allocated and not sched.has_work()


def test_atomic_embeddings_complete_in_their_step():
    sched, runner = create_scheduler(embed_chunked=False), FakeRunner()
    reqs = [create_request(lane="embeddings", num_prompt=n, kind=Kind.EMBED) for n in (5, 50, 300)]
    for r in reqs:
        sched.add_request(r)
    run_until_idle(sched, runner)
    assert [r.embedding for r in reqs] == [[5.0], [50.0], [300.0]]
    sizes = sorted(len(i.tokens) for p in runner.plans for i in p.batches[Pool.EMBED])
    assert sizes == [5, 50, 300]


def test_no_kv_slot_keeps_nothing_and_the_work_completes():
    sched, runner = create_scheduler(), FakeRunner()
    requests = [create_request(num_prompt=40, max_tokens=6, member=f"m{i}") for i in range(4)]
    for r in requests:
        sched.add_request(r)
    plan = sched.schedule(0.0)
    from homeai.sched.scheduler import StepResult
    sched.update(plan, StepResult(no_kv_slot=True), 0.01)
    for item in plan.items:  # the fake model forgets what llama.cpp rolled back
        runner.positions.pop((Pool.MAIN, item.seq_id), None)
    assert all(r.num_computed_tokens == 0 for r in requests)
    run_until_idle(sched, runner, 0.02)
    assert all(r.finished and len(r.output_tokens) == 6 for r in requests)


def test_interactive_decoding_keeps_steps_short():
    sched, runner = create_scheduler(max_step_tokens=256), FakeRunner()
    for _ in range(50):  # teach the cost model: 2 ms per token
        sched.cost.observe(StepShape(1, 100), 200.0)
        sched.cost.observe(StepShape(1, 10), 20.0)
    chat = create_request(lane="chat", num_prompt=10, max_tokens=50)
    sched.add_request(chat)
    step(sched, runner, 0.0)
    sched.add_request(create_request(lane="summaries", num_prompt=2000, max_tokens=5, arrival=0.0))
    plan, _ = step(sched, runner, 1.0)
    assert sched.cost.predict_ms(plan.shape) <= sched.policies["chat"].itl_target_ms
    sched.abort(chat.request_id)
    step(sched, runner, 1.1)
    short = plan.num_tokens
    context = sum(r.num_computed_tokens for r in sched.running)
    lone = sched.pacing.aim(None, lone=True)  # nothing decodes: a prompt alone may take a longer step
    assert lone > sched.pacing.aim(None) > sched.policies["chat"].itl_target_ms
    grown = sched.cost.tokens_within(lone, StepShape(0), context, new_decode=True)
    plan, _ = step(sched, runner, 1.2)
    assert plan.num_tokens == min(grown, 256) > short, "with no interactive decode the step grows for throughput"


def test_embeddings_longer_than_a_step_are_not_starved_by_decoding_summaries():
    sched, runner = create_scheduler(max_step_tokens=64), FakeRunner()
    for i in range(3):
        sched.add_request(create_request(lane="summaries", member=f"d{i}", num_prompt=100, max_tokens=400))
    run_steps = 0
    while not all(r.is_decoding for r in sched.running) or len(sched.running) < 3:
        step(sched, runner, run_steps * 0.01)
        run_steps += 1
    embeds = [create_request(lane="embeddings", num_prompt=200, kind=Kind.EMBED, arrival=1.0) for _ in range(4)]
    for r in embeds:
        sched.add_request(r)
    now = 2.0
    for _ in range(50):
        step(sched, runner, now)
        now += 0.01
    assert all(r.finished for r in embeds), "200-token inputs never fit a 64-token step beside decodes"


def test_atomic_embeddings_under_interactive_load_go_once_background_credit_covers_them():
    sched, runner = create_scheduler(max_step_tokens=64, embed_chunked=False), FakeRunner()
    embed = create_request(lane="embeddings", num_prompt=200, kind=Kind.EMBED, arrival=0.0)
    sched.add_request(embed)
    now = 0.0
    for i in range(400):
        if sched.num_waiting("chat") < 2:
            sched.add_request(create_request(lane="chat", member=f"m{i % 3}", num_prompt=30, max_tokens=40,
                                             arrival=now))
        step(sched, runner, now)
        now += 0.01
        if embed.finished:
            break
    assert embed.finished


@pytest.mark.parametrize("lane", ["embeddings", "indexing"])
def test_an_overdue_atomic_input_overflows_a_busy_step_whatever_its_lane(lane):
    """With no minimum share to pay it, an atomic input larger than any step's room beside
    interactive work goes once its lane is overdue: indexing's inputs as well as embeddings'."""
    sched, runner = create_scheduler(max_step_tokens=64, embed_chunked=False, background_min_share=0.0), FakeRunner()
    embed = create_request(lane=lane, num_prompt=200, kind=Kind.EMBED, arrival=0.0)
    sched.add_request(embed)
    now = 0.0
    for i in range(8000):
        if sched.num_waiting("chat") < 2:
            sched.add_request(create_request(lane="chat", member=f"m{i % 3}", num_prompt=30, max_tokens=40,
                                             arrival=now))
        step(sched, runner, now)
        now += 0.01
        if embed.finished:
            break
    assert embed.finished, f"an atomic {lane} input starved beside chats"


def test_a_background_request_that_cannot_fit_never_holds_back_interactive_prefill():
    """Background's owed share is not reserved while its request cannot be admitted: a chat
    prefilling in small chunks beside a preempted summary gets every step's whole budget."""
    sched, runner = create_scheduler(num_cells=490, num_seqs=4), FakeRunner()
    for _ in range(50):  # teach the cost model: 5 ms per token, so a step carries about 20
        sched.cost.observe(StepShape(1, 100), 500.0)
        sched.cost.observe(StepShape(1, 10), 50.0)
    background = create_request(lane="summaries", num_prompt=190, max_tokens=30, arrival=0.0)
    sched.add_request(background)
    now = 0.0
    while len(background.output_tokens) < 10:
        step(sched, runner, now)
        now += 0.01
    chat = create_request(lane="chat", num_prompt=300, max_tokens=5, arrival=now)
    sched.add_request(chat)
    now += 0.01
    step(sched, runner, now)
    assert background.status is Status.WAITING, "the chat preempts the summary"
    while not chat.is_decoding:
        assert not sched.pools.fits(Pool.MAIN, background.num_tokens), "which cannot come back while the chat runs"
        now += 0.01
        left = chat.num_remaining
        plan, _ = step(sched, runner, now)
        assert plan.num_tokens == min(plan.budget, left), "budget kept for background that cannot use it"
    run_until_idle(sched, runner, now)
    assert chat.finished and background.finished and len(background.output_tokens) == 30


def test_with_an_interactive_cache_chats_neither_preempt_nor_attend_over_background():
    """Interactive lanes get a cache of their own: sequence ids of its own, no
    preemption of a summary for a chat, and each token costed over its own cache's cells."""
    sched, runner = create_scheduler(num_cells=300, num_seqs=4, interactive_cells=200), FakeRunner()
    background = create_request(lane="summaries", num_prompt=250, max_tokens=40, arrival=0.0)
    sched.add_request(background)
    now = 0.0
    while not background.is_decoding:
        step(sched, runner, now)
        now += 0.01
    chat = create_request(lane="chat", num_prompt=150, max_tokens=5, arrival=now)
    sched.add_request(chat)
    now += 0.01
    plan, _ = step(sched, runner, now)
    assert background.num_preemptions == 0
    assert {i.request_id for i in plan.batches[Pool.INTERACTIVE]} == {chat.request_id}
    assert sched.pools.kv[Pool.MAIN].num_used_cells == background.num_computed_tokens
    assert sched.pools.kv[Pool.INTERACTIVE].num_used_cells == 150
    # While the chat's prompt is read, the summary's decode waits (it would cost a second decode call).
    assert plan.shape.decodes == 1 and plan.shape.tokens == chat.num_computed_tokens
    assert plan.shape.token_kcells == 0  # the chat's chunk attends over none of the summary's cells
    while not chat.is_decoding:
        now += 0.01
        plan, _ = step(sched, runner, now)
    now += 0.01
    plan, _ = step(sched, runner, now)  # both decode: one call per cache, each over its own cells
    assert plan.shape.decodes == 2 and plan.shape.tokens == 2
    assert plan.shape.token_kcells == (background.num_computed_tokens - 1 + chat.num_computed_tokens - 1) / 1000
    run_until_idle(sched, runner, now)
    assert chat.finished and background.finished and len(background.output_tokens) == 40
    assert sched.pools.kv[Pool.MAIN].num_used_cells == 0 and sched.pools.kv[Pool.INTERACTIVE].num_used_cells == 0


def _reader_beside_document(interactive_cells, document_len, document_output=100, cost=None, num_cells=8192,
                            num_seqs=8, reader_prompt=10, reader_output=500, **limits):
    """A chat reader and a summary, both decoding (under a step cost function, if given)."""
    sched = create_scheduler(num_cells=num_cells, num_seqs=num_seqs, interactive_cells=interactive_cells, **limits)
    if cost:
        _taught(sched, cost)
    runner = FakeRunner(cost=cost)
    reader = create_request(lane="chat", member="bob", num_prompt=reader_prompt, max_tokens=reader_output)
    document = create_request(lane="summaries", num_prompt=document_len, max_tokens=document_output)
    sched.add_request(reader)
    sched.add_request(document)
    now = 0.0
    while not (reader.is_decoding and document.is_decoding):
        step(sched, runner, now)
        now += 0.01
    return sched, runner, now, reader, document


def test_a_chat_reads_its_prompt_faster_beside_a_long_document_with_its_own_cache():
    """The point of the second cache: under the same inter-token target, a chat's prompt gets
    more of each step when its tokens do not attend over a 3,000-token document."""
    def cpu(shape):  # a CPU's shape: 10 ms a decode call, 3 ms a token, 1 ms a token per thousand cells
        return 10 * shape.decodes + 3 * shape.tokens + shape.token_kcells + shape.outputs

    def chunks(interactive_cells):
        sched, runner, now, _, _ = _reader_beside_document(interactive_cells, 3000, cost=cpu)
        chat = create_request(lane="chat", num_prompt=200, max_tokens=5, arrival=now)
        sched.add_request(chat)
        step(sched, runner, now + 0.01)
        plan, _ = step(sched, runner, now + 0.02)
        return next(len(i.tokens) for i in plan.items if i.request_id == chat.request_id)
    shared, split = chunks(0), chunks(2048)
    assert split > 1.5 * shared, (shared, split)


def test_a_chat_that_cannot_get_cells_does_not_hold_background_decodes_back():
    # The main cache (100 cells) holds the document at background's floor: nothing there for the chat
    sched, runner, now, reader, background = _reader_beside_document(
        100, 50, document_output=30, num_cells=100, num_seqs=4, reader_prompt=80, reader_output=15,
        background_min_share=0.9)
    waiting = create_request(lane="chat", member="carol", num_prompt=60, max_tokens=5, arrival=now)
    sched.add_request(waiting)  # fits neither beside the reader nor beside the document: it waits for cells
    for _ in range(3):
        now += 0.01
        plan, _ = step(sched, runner, now)
        assert waiting.status is Status.WAITING
        assert background.request_id in {i.request_id for i in plan.items}
    run_until_idle(sched, runner, now)
    assert waiting.finished and background.finished


def test_readers_admitted_at_once_keep_their_pace_as_they_grow():
    """A burst of chats: each is let in only while every reader, costed at the lane's typical
    output length, still decodes within the aim. Costing them at their length now lets in
    young chats that, grown, slow every reader past its inter-token target."""
    sched = _taught(create_scheduler(num_cells=8192, num_seqs=32, interactive_cells=8192), _cpu)
    runner = FakeRunner(cost=_cpu)
    target = sched.policies["chat"].itl_target_ms
    assert sched.reading_pace("chat") == target  # a lone reader's step is well within it
    for i in range(40):  # a first wave teaches the lane its typical length (~100 tokens)
        sched.add_request(create_request(lane="chat", member=f"m{i % 4}", num_prompt=30, max_tokens=100))
    now = run_until_idle(sched, runner)
    assert 90 < sched.typical_output("chat") <= 100
    burst = [create_request(lane="chat", member=f"m{i % 4}", num_prompt=30, max_tokens=100, arrival=now)
             for i in range(30)]
    for r in burst:
        sched.add_request(r)
    most = 0
    while sched.has_work():
        reading = [r for r in sched.running if r.is_decoding]
        # While a member with no answer decoding has a question to read, a step may run up to
        # `first_read` times the pace (its first token comes sooner); otherwise within the pace.
        first = {r.member for r in burst if not r.finished and not r.output_tokens} - {r.member for r in reading}
        plan, _ = step(sched, runner, now)
        now += 0.05
        most = max(most, len(sched.running))
        if reading:  # every step a reader waits for
            bound = target * (PaceTuning().first_read if first else 1.0)
            assert _cpu(plan.shape) <= bound, (len(reading), _cpu(plan.shape))
    assert all(r.finished for r in burst) and 3 < most < 30


def _slow_cpu(shape):  # a large model on a CPU: the weights' pass alone is most of the chat's target
    return 85 * shape.decodes + 12 * shape.tokens + 1.5 * shape.token_kcells + shape.outputs


def test_on_a_machine_too_slow_for_the_reading_pace_chats_share_the_steps():
    """Where one reader's decode alone takes most of the inter-token target, readers are still
    let in together, each held to `shared_pace` times a lone reader's step, rather than each
    waiting for the one before it to finish (which is a one-at-a-time server)."""
    sched = _taught(create_scheduler(num_cells=8192, num_seqs=32, interactive_cells=8192), _slow_cpu)
    runner = FakeRunner(cost=_slow_cpu)
    lone = _slow_cpu(StepShape(1, 1, 0.0, 1))
    tuning = PaceTuning()
    assert lone > tuning.readers_aim * sched.policies["chat"].itl_target_ms  # the target cannot be kept
    assert sched.reading_pace("chat") == pytest.approx(tuning.shared_pace * lone / tuning.readers_aim, rel=0.15)
    assert sched.reading_pace("summaries") is None
    chats = [create_request(lane="chat", member=f"m{i}", num_prompt=30, max_tokens=60) for i in range(12)]
    for r in chats:
        sched.add_request(r)
    now, most = 0.0, 0
    pace = tuning.shared_pace * lone / tuning.readers_aim
    while sched.has_work():
        reading = [r for r in sched.running if r.is_decoding]
        first = any(not r.finished and not r.output_tokens for r in chats)  # one chat a member: all first questions
        plan, _ = step(sched, runner, now)
        now += 0.2
        most = max(most, len(reading))
        if reading:
            assert _slow_cpu(plan.shape) <= (tuning.first_read if first else tuning.step_aim) * pace * 1.05
    assert all(r.finished for r in chats) and 3 < most < 12, most


def test_a_chat_read_beside_a_decoding_summary_does_not_pay_its_decode_call_every_step():
    """While a chat's prompt is read, the summary's decodes (a second decode call, in its own
    cache) come back as background's minimum share is owed, the call's fixed cost counted:
    not in every step, and not never."""
    sched, runner, now, _, document = _reader_beside_document(2048, 500, document_output=400, cost=_cpu)
    chat = create_request(lane="chat", num_prompt=400, max_tokens=5, arrival=now)
    sched.add_request(chat)
    steps = with_document = 0
    while not chat.is_decoding:
        now += 0.01
        plan, _ = step(sched, runner, now)
        steps += 1
        with_document += document.request_id in {i.request_id for i in plan.items}
        # bob reads on; the chat is its member's first question: its last steps may run longer
        assert _cpu(plan.shape) <= sched.policies["chat"].itl_target_ms * PaceTuning().first_read
    assert steps > 20 and 0 < with_document <= steps / 3, (with_document, steps)


def test_a_voice_question_is_let_in_beside_chats_at_their_pace():
    """Chats at their reading pace keep a new chat waiting, but not a voice question: its lane
    beats every reader's priority."""
    sched = _taught(create_scheduler(num_cells=8192, num_seqs=32, interactive_cells=8192), _cpu)
    runner = FakeRunner(cost=_cpu)
    for i in range(30):
        sched.add_request(create_request(lane="chat", member=f"m{i % 4}", num_prompt=30, max_tokens=300))
    now = 0.0
    while sched.num_waiting("chat") == 30 or any(not r.is_decoding for r in sched.running):
        step(sched, runner, now)
        now += 0.05
    assert 0 < sched.num_waiting("chat") < 30, "the chats' pace holds some of them back"
    voice = create_request(lane="voice", member="kitchen", num_prompt=40, max_tokens=20, arrival=now)
    sched.add_request(voice)
    for _ in range(3):
        now += 0.05
        step(sched, runner, now)
    assert voice.status is Status.RUNNING and voice.num_computed_tokens > 0


def _voice_beside_a_document(held: bool):
    """A voice answer decoding while a long document is read; per step while it decodes, the
    step's cost and the document's prompt tokens."""
    sched = _taught(create_scheduler(num_cells=8192, num_seqs=8), _cpu)
    runner = FakeRunner(cost=_cpu)
    document = create_request(lane="summaries", num_prompt=6000, max_tokens=20)
    voice = create_request(lane="voice", member="kitchen", num_prompt=20, max_tokens=60)
    sched.add_request(document)
    sched.add_request(voice)
    now, steps = 1.0, []
    while len(steps) < 20:
        voice.held = held and bool(voice.output_tokens)
        decoding = voice.is_decoding
        plan, _ = step(sched, runner, now)
        now += _cpu(plan.shape) / 1000.0
        if decoding:
            read = sum(len(i.tokens) for i in plan.items if i.request_id == document.request_id)
            steps.append((_cpu(plan.shape), read))
    return steps


def test_a_held_output_decodes_near_decode_speed_and_prompts_still_read():
    """A tool call being written is read whole, not at reading pace: while it decodes, steps aim
    at `held_step` times what the decodes alone take, and the document is read in smaller chunks."""
    paced, held = _voice_beside_a_document(False), _voice_beside_a_document(True)
    lone_decode = _cpu(StepShape(1, 1, 0.0, 1))
    assert min(ms for ms, _ in paced) > 2 * lone_decode  # at reading pace: prefill fills each step
    assert max(ms for ms, _ in held) <= PaceTuning().held_step * lone_decode * 1.2
    assert sum(ms for ms, _ in held) < 0.6 * sum(ms for ms, _ in paced)
    assert all(read > 0 for _, read in held)  # the document is still read, a chunk every step


def _held_beside_background(held: bool) -> dict[str, int]:
    """Voice decoding with a cache of its own beside a summary decoding and overdue embeddings:
    over 40 steps, the steps each got a token in."""
    sched = _taught(create_scheduler(num_cells=8192, num_seqs=8, interactive_cells=2048), _cpu)
    runner = FakeRunner(cost=_cpu)
    summary = create_request(lane="summaries", num_prompt=50, max_tokens=400)
    voice = create_request(lane="voice", member="kitchen", num_prompt=20, max_tokens=100)
    sched.add_request(summary)
    now = 1.0
    while not summary.is_decoding or not voice.is_decoding:
        if summary.is_decoding and voice.status is Status.WAITING and voice.request_id not in sched.requests:
            voice.arrival_time = now
            sched.add_request(voice)
        step(sched, runner, now)
        now += 0.05
    for i in range(6):  # waiting since long before: overdue
        sched.add_request(create_request(lane="embeddings", member=f"e{i}", num_prompt=40, kind=Kind.EMBED, arrival=0.0))
    served = {"voice": 0, "summaries": 0, "embeddings": 0}
    for _ in range(40):
        voice.held = held
        plan, _ = step(sched, runner, now)
        now += _cpu(plan.shape) / 1000.0
        for lane in served:
            served[lane] += any(sched.requests.get(i.request_id, voice).lane == lane for i in plan.items)
    return served


def test_while_a_held_output_decodes_background_decodes_wait_and_nothing_is_overdue():
    """With a cache of its own, a held output's steps are its own decode call: background decodes
    (a second call) and overdue lanes wait, but for their minimum share."""
    paced, held = _held_beside_background(False), _held_beside_background(True)
    assert paced["voice"] == held["voice"] == 40
    assert paced["summaries"] == 40 and held["summaries"] < 10
    assert 0 < held["summaries"] + held["embeddings"] and held["embeddings"] < paced["embeddings"] / 2


@pytest.mark.parametrize("interactive_cells", [0, 2048])
def test_the_step_giving_a_first_token_carries_little_background(interactive_cells):
    """A spoken question beside documents being read: the step that samples its first token
    carries background only up to `held_step` times its own cost (the documents' overdue share
    waits a step), and the step after it does not wait again."""
    sched = _taught(create_scheduler(num_cells=8192, num_seqs=8, interactive_cells=interactive_cells), _cpu)
    runner = FakeRunner(cost=_cpu)
    for i in range(3):
        sched.add_request(create_request(lane="summaries", member=f"d{i}", num_prompt=2000, max_tokens=20))
    now = 1.0
    for _ in range(5):
        plan, _ = step(sched, runner, now)
        now += 60.0  # the documents wait long: overdue from here on
    voice = create_request(lane="voice", member="kitchen", num_prompt=12, max_tokens=8, arrival=now)
    sched.add_request(voice)
    plans = []
    while not voice.output_tokens:
        plan, _ = step(sched, runner, now)
        now += _cpu(plan.shape) / 1000.0
        plans.append(plan)
    first = plans[-1]
    attended = 12 if interactive_cells else first.context_cells  # one cache: the question attends over the documents
    alone = _cpu(StepShape(1, 12, 12 * attended / 1000.0, 1))
    assert _cpu(first.shape) <= PaceTuning().held_step * alone * 1.05
    after, _ = step(sched, runner, now)  # the documents' turn: their overdue share goes
    background = sum(len(i.tokens) for i in after.items if i.request_id != voice.request_id)
    assert background >= sched.share.share_tokens()


class _PoisonedCost(StepCostModel):
    """A fit a noisy neighbour poisoned that never learns again: every step a minute and more."""

    def observe(self, x, elapsed_ms, now=None):
        pass

    @property
    def coefficients(self):
        return (60_000.0, 1_000.0, 100.0, 1_000.0)


@pytest.mark.parametrize("interactive_cells", [0, 2048])
def test_a_cost_model_predicting_absurd_steps_still_serves_every_lane_within_its_target(interactive_cells):
    """The cost model learns only from steps that run: if its predictions alone decided, a
    poisoned fit would stop the very steps that could correct it (embeddings waited minutes on
    an idle box). Lanes overdue get their share of a step whatever the model says."""
    sched = create_scheduler(interactive_cells=interactive_cells)
    sched.cost = _PoisonedCost()
    runner = FakeRunner(step_ms=10.0)
    requests = [create_request(lane="embeddings", member=f"m{i % 2}", num_prompt=40, kind=Kind.EMBED)
                for i in range(8)]
    requests += [create_request(lane="summaries", num_prompt=200, max_tokens=20),
                 create_request(lane="indexing", num_prompt=60, kind=Kind.EMBED)]
    requests += [create_request(lane="chat", member=f"c{i}", num_prompt=30, max_tokens=200, arrival=15.0 + i * 2.0)
                 for i in range(3)]  # background first, on an idle box: nothing else pays its share
    now = 0.0
    while not all(r.finished for r in requests) and now < 120:
        for r in requests:
            if r.arrival_time <= now and r.request_id not in sched.requests and r.status is Status.WAITING:
                sched.add_request(r)
        step(sched, runner, now)
        now += runner.step_ms / 1000
    assert all(r.finished for r in requests)
    for r in requests:
        waited_ms = (r.first_token_time - r.arrival_time) * 1000
        assert waited_ms <= sched.policies[r.lane].ttft_target_ms, (r.lane, waited_ms)


def test_a_chat_let_in_holds_background_decodes_back_from_its_first_step():
    """Every rule of a step reads the same eligibility: the chat that becomes eligible this step
    (and is read in it) is also what makes the summary's decode wait, not the cutoffs of the
    step before, when the chat was still inside its batching window."""
    sched, runner = create_scheduler(num_cells=300, num_seqs=4, interactive_cells=200), FakeRunner()
    background = create_request(lane="summaries", num_prompt=100, max_tokens=40, arrival=0.0)
    sched.add_request(background)
    now = 0.0
    while not background.is_decoding:
        step(sched, runner, now)
        now += 0.01
    chat = create_request(lane="chat", num_prompt=50, max_tokens=5, arrival=now)
    sched.add_request(chat)
    plan, _ = step(sched, runner, now)  # the engine is busy: the chat waits out its window
    assert chat.status is Status.WAITING and background.request_id in {i.request_id for i in plan.items}
    plan, _ = step(sched, runner, now + 0.01)
    assert {i.request_id for i in plan.items} == {chat.request_id}, "the summary's decode waits for the chat's prompt"


def test_a_hold_on_background_runs_only_steps_with_interactive_work():
    """The voice turn's pause: background waits, its cells kept, while nothing interactive runs;
    an interactive request brings steps back, with background beside it."""
    sched, runner = create_scheduler(), FakeRunner()
    summary = create_request(lane="summaries", num_prompt=40, max_tokens=20)
    sched.add_request(summary)
    now = 0.0
    while not summary.is_decoding:
        step(sched, runner, now)
        now += 0.01
    computed = summary.num_computed_tokens
    for _ in range(3):
        plan = sched.schedule(now, hold_background=True)
        assert plan.empty and plan.budget == 0
        now += 0.01
    assert summary.num_computed_tokens == computed and summary.seq_id is not None, "its cells are kept"
    chat = create_request(lane="chat", num_prompt=20, max_tokens=3, arrival=now)
    sched.add_request(chat)
    plan = sched.schedule(now + 0.01, hold_background=True)
    assert {i.request_id for i in plan.items} == {chat.request_id, summary.request_id}


class _OneAtATime:
    """A policy through the public protocol: arrival order, one request at a time, 24 tokens a step."""

    def order(self, partial, waiting):
        return partial + sorted((r for q in waiting.values() for r in q), key=lambda r: r.arrival_time)

    def admission_open(self, *, num_running, num_admitted, began_idle):
        return num_running == 0

    def budget(self, max_step_tokens):
        return 24


def test_a_policy_sets_the_order_admission_and_budget():
    from dataclasses import replace

    from homeai.sched.scheduler import Scheduler, SchedulerLimits
    from lanes import BACKGROUND, DEFAULT_POLICIES

    lanes = {name: replace(p, lane_class=BACKGROUND, window_ms=0.0) for name, p in DEFAULT_POLICIES.items()}
    limits = SchedulerLimits(num_cells=4096, num_seqs=16, max_step_tokens=256, embed_max_tokens=512, embed_max_seqs=16)
    sched, runner = Scheduler(lanes, limits, _OneAtATime()), FakeRunner()
    requests = [create_request(lane=lane, member=f"m{i}", num_prompt=40, max_tokens=5, arrival=0.1 * (3 - i))
                for i, lane in enumerate(["summaries", "chat", "voice"])]  # the voice question arrived first
    for r in requests:
        sched.add_request(r)
    now = 1.0
    while sched.has_work():
        plan, _ = step(sched, runner, now)
        now += 0.01
        assert plan.budget == 24 and len(sched.running) <= 1
    assert [r.finish_time for r in reversed(requests)] == sorted(r.finish_time for r in requests)


def test_a_step_is_built_with_its_fields_in_the_order_schedule_passes_them():
    """`Scheduler._begin` builds each step's `Step` by position (naming them costs several thousand
    instructions a step): reordering the fields must change that call too."""
    from dataclasses import fields

    from homeai.sched.step import Step

    assert [f.name for f in fields(Step)] == [
        "now", "cost", "cutoffs", "admissions", "overdue", "began_idle", "prompt", "cells", "num_decoding",
        "decodes", "deferred", "pace", "aim", "lone", "held", "first_token_waits", "min_chunk", "planned"]


def test_a_long_members_question_read_alone_takes_plain_steps_a_short_one_or_a_background_prompt_longer_ones():
    """Nothing decodes: a background prompt read alone takes `lone_step` times the aim (fewer fixed
    costs), and so does a member's question that one such step finishes (its first token comes sooner);
    a longer question is read in plain steps, since another member asking meanwhile waits for the step
    in flight (a camera's picture questions held a chat's TTFT p95 at 6.2x idle, 2.1x so)."""
    predicted, read = {}, {}
    for lane, n in (("chat", 500), ("chat", 60), ("summaries", 500)):
        sched, runner = _taught(create_scheduler(max_step_tokens=512), _cpu), FakeRunner(cost=_cpu)
        sched.add_request(create_request(lane=lane, num_prompt=n, max_tokens=4))
        plan, _ = step(sched, runner, 5.0)  # (past any lane's batching window)
        predicted[lane, n], read[lane, n] = sched.cost.predict_ms(plan.shape), plan.num_tokens
    aim = create_scheduler().pacing.aim(None)
    assert predicted["chat", 500] <= aim * 1.05 < predicted["summaries", 500], predicted
    assert read["chat", 60] == 60 and predicted["chat", 60] > aim, (read, predicted)  # one longer step finishes it
