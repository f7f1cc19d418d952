"""The prompt cache in the scheduler: reuse, sharing, eviction and limits, checked by the fake
runner's position bookkeeping (every cache operation must leave each sequence's cells where the
next item starts); and whose cells a request may reuse: its own member's, another member's only
as far as no member wrote them (`public_len`), everyone's with `prompt_cache_shared`."""

from __future__ import annotations

import itertools

from homeai.sched.pools import Copy, Drop, Pool
from homeai.sched.request import Kind, Request, SamplingParams, Status
from homeai.sched.scheduler import QueueFull, StepResult
from tests.sched.helpers import FakeRunner, create_scheduler, run_until_idle, step, token_for

_ids = itertools.count()
SYSTEM = list(range(100, 400))  # a 300-token stable prefix (a system prompt)


def request(prompt, lane="chat", member="alice", max_tokens=4, arrival=0.0, kind=Kind.GENERATE,
            public_len=0) -> Request:
    return Request(f"p{next(_ids)}", lane, member, list(prompt), arrival, kind=kind,
                   params=SamplingParams(max_tokens=max_tokens), public_len=public_len)


def cached(**overrides):
    return create_scheduler(prompt_cache=True, max_step_ms=1000.0, **overrides)


def first_item(plan_log, r):
    return next(i for plan in plan_log for i in plan.items if i.request_id == r.request_id)


def test_a_finished_requests_prefix_is_read_once():
    sched, runner = cached(), FakeRunner()
    first = request(SYSTEM + [1, 2, 3])
    sched.add_request(first)
    now = run_until_idle(sched, runner)
    assert first.finished and first.num_cached_tokens == 0
    assert sched.pools.cells_cached(Pool.MAIN) == first.num_computed_tokens == 303 + 3  # its prompt and output
    turn2 = request(SYSTEM + [1, 2, 3] + first.output_tokens + [7, 8, 9], arrival=now)
    charged_before = sched.fair.counter(turn2.key)
    sched.add_request(turn2)
    run_until_idle(sched, runner, now)
    assert turn2.finished and turn2.num_cached_tokens == 306
    assert first_item(runner.plans, turn2).start == 306, "only the new turn's tokens were read"
    assert turn2.output_tokens == [token_for(turn2.request_id, turn2.num_prompt_tokens + k) for k in range(4)]
    # fair share: the lane is charged the 4 prompt tokens computed (turn 1's last output token and
    # the 3 new ones) and its output, not the 306 cached
    charged = sched.fair.counter(turn2.key) - charged_before
    assert charged == (4 * sched.fair.w_in + 4 * sched.fair.w_out) / sched.policies["chat"].weight


def test_a_partial_match_drops_the_entrys_tail_and_reads_from_there():
    sched, runner = cached(), FakeRunner()
    first = request(SYSTEM + list(range(500, 600)))
    sched.add_request(first)
    now = run_until_idle(sched, runner)
    seq = next(iter(sched.pools.cache[Pool.MAIN].entries))
    edited = request(SYSTEM + list(range(500, 560)) + [9, 9, 9], arrival=now)  # history edited at 360
    sched.add_request(edited)
    plan, _ = step(sched, runner, now + 0.01)
    assert Drop(seq, 360) in plan.cache_ops[Pool.MAIN] and edited.seq_id == seq
    assert first_item(runner.plans, edited).start == 360 and edited.num_cached_tokens == 360
    run_until_idle(sched, runner, now + 0.02)
    assert edited.finished


def test_the_last_prompt_token_is_always_computed():
    sched, runner = cached(), FakeRunner()
    first = request(SYSTEM, max_tokens=1)
    sched.add_request(first)
    now = run_until_idle(sched, runner)
    again = request(SYSTEM, arrival=now)  # the very same prompt
    sched.add_request(again)
    run_until_idle(sched, runner, now)
    item = first_item(runner.plans, again)
    assert item.start == 299 and item.tokens == [SYSTEM[-1]] and item.sample


def test_a_barely_matching_entry_is_shared_not_destroyed():
    sched, runner = cached(), FakeRunner()
    long = request(SYSTEM + list(range(1000, 1500)), max_tokens=1)
    sched.add_request(long)
    now = run_until_idle(sched, runner)
    entry_seq = next(iter(sched.pools.cache[Pool.MAIN].entries))
    other = request(SYSTEM + [5, 6, 7], arrival=now)  # shares 300 of the entry's 800 cells
    sched.add_request(other)
    plan, _ = step(sched, runner, now + 0.01)
    assert Copy(entry_seq, other.seq_id, 300) in plan.cache_ops[Pool.MAIN] and other.seq_id != entry_seq
    assert entry_seq in sched.pools.cache[Pool.MAIN].entries, "the long entry stays for its own next turn"
    run_until_idle(sched, runner, now + 0.02)
    assert other.finished and other.num_cached_tokens == 300


def test_a_live_sequences_prefix_is_shared_with_a_new_request():
    sched, runner = cached(), FakeRunner()
    # SYSTEM is the lane's configured prompt, which no member wrote: bob may reuse it from alice's cells
    a = request(SYSTEM + [1], member="alice", max_tokens=50, public_len=300)
    sched.add_request(a)
    now = 0.0
    while not a.is_decoding:
        step(sched, runner, now)
        now += 0.01
    b = request(SYSTEM + [2], member="bob", arrival=now, public_len=300)
    sched.add_request(b)
    plan, _ = step(sched, runner, now + 0.01)
    assert Copy(a.seq_id, b.seq_id, 300) in plan.cache_ops[Pool.MAIN]
    assert first_item(runner.plans, b).start == 300
    run_until_idle(sched, runner, now + 0.02)
    assert a.finished and b.finished
    assert a.output_tokens == [token_for(a.request_id, 301 + k) for k in range(50)]


def test_entries_are_evicted_before_anyone_is_refused_or_preempted():
    # 2000 cells, 4 sequence ids: three finished conversations leave 1200 cached cells behind
    sched, runner = cached(num_cells=2000, num_seqs=4), FakeRunner()
    now = 0.0
    for k in range(3):
        r = request([k + 1] * 20 + list(range(400)), member=f"m{k}", arrival=now)
        sched.add_request(r)
        now = run_until_idle(sched, runner, now)
    assert len(sched.pools.cache[Pool.MAIN]) == 3 and sched.pools.cells_cached(Pool.MAIN) > 1200
    background = request(list(range(5000, 5900)), lane="summaries", max_tokens=30, arrival=now)
    chat = request(list(range(7000, 7800)), max_tokens=5, arrival=now)
    sched.add_request(background)
    sched.add_request(chat)
    run_until_idle(sched, runner, now)
    assert background.finished and chat.finished
    assert background.num_preemptions == 0 and chat.num_preemptions == 0, "cached cells gave way first"
    assert sched.pools.kv[Pool.MAIN].num_used_cells == 0


def test_a_preempted_request_resumes_from_its_own_cached_cells():
    sched, runner = cached(num_cells=700, num_seqs=4), FakeRunner()
    background = request(list(range(2000, 2300)), lane="summaries", max_tokens=40)
    sched.add_request(background)
    now = 0.0
    while len(background.output_tokens) < 10:
        step(sched, runner, now)
        now += 0.01
    chat = request(list(range(3000, 3380)), max_tokens=30, arrival=now)  # needs 380 + 30 of the 390 left
    sched.add_request(chat)
    now += 0.01
    while background.num_preemptions == 0:
        step(sched, runner, now)
        now += 0.01
    assert background.status is Status.WAITING  # it could not grow: its cells stay cached until needed
    step(sched, runner, now)
    now += 0.01
    assert sched.pools.cells_cached(Pool.MAIN) == 0, "the chat's next token needed its cells, so its entry went"
    run_until_idle(sched, runner, now)
    assert background.output_tokens == [token_for(background.request_id, 300 + k) for k in range(40)]
    assert chat.finished


def test_a_preempted_requests_entry_is_reused_when_room_comes_back_first():
    sched, runner = cached(num_cells=1000, num_seqs=4), FakeRunner()
    background = request(list(range(2000, 2300)), lane="summaries", max_tokens=40)
    sched.add_request(background)
    now = 0.0
    while len(background.output_tokens) < 10:
        step(sched, runner, now)
        now += 0.01
    sched._preempt(background, None)  # as an interactive request would, with its cells not yet needed
    assert sched.pools.cells_cached(Pool.MAIN) == 309
    before = len(runner.plans)
    run_until_idle(sched, runner, now)
    resumed = first_item(runner.plans[before:], background)
    assert resumed.start == 309 and background.num_cached_tokens == 0, "a resume is not a prompt-cache hit"
    assert background.output_tokens == [token_for(background.request_id, 300 + k) for k in range(40)]


def test_a_cache_full_of_entries_never_refuses_a_request():
    sched, runner = cached(num_cells=600, num_seqs=2), FakeRunner()
    now = 0.0
    for k in range(2):  # both sequence ids end up held by entries
        sched.add_request(request([k + 1] * 20 + list(range(250)), member=f"m{k}", arrival=now))
        now = run_until_idle(sched, runner, now)
    assert len(sched.pools.cache[Pool.MAIN]) == 2 and not sched.pools.kv[Pool.MAIN].free_seq_ids
    fresh = [request(list(range(9000 + 10 * k, 9000 + 10 * k + 280)), member=f"n{k}", arrival=now) for k in range(2)]
    for r in fresh:
        try:
            sched.add_request(r)
        except QueueFull:  # pragma: no cover - the assertion below says what went wrong
            raise AssertionError("a cache full of entries refused a request")
    run_until_idle(sched, runner, now)
    assert all(r.finished and r.num_preemptions == 0 for r in fresh)


def test_the_cap_keeps_entries_within_their_cells():
    sched, runner = cached(prompt_cache_max_cells=500), FakeRunner()
    now = 0.0
    for k in range(3):
        sched.add_request(request([k + 1] * 20 + list(range(300)), member=f"m{k}", arrival=now))
        now = run_until_idle(sched, runner, now)
        assert sched.pools.cells_cached(Pool.MAIN) <= 500
    big = request(list(range(4000, 4700)), arrival=now, max_tokens=1)
    sched.add_request(big)
    run_until_idle(sched, runner, now)
    assert sched.pools.cells_cached(Pool.MAIN) == 500, "the newest entry was trimmed to the cap"


def test_the_interactive_pool_caches_on_its_own():
    sched, runner = cached(interactive_cells=2000), FakeRunner()
    chat = request(SYSTEM + [1])
    summary = request(SYSTEM + [2], lane="summaries")
    sched.add_request(chat)
    sched.add_request(summary)
    now = run_until_idle(sched, runner)
    assert sched.pools.cells_cached(Pool.INTERACTIVE) == chat.num_computed_tokens == 304  # 301 + 3 of 4 outputs
    assert sched.pools.cells_cached(Pool.MAIN) == summary.num_computed_tokens
    voice = request(SYSTEM + [3], lane="voice", arrival=now)
    sched.add_request(voice)
    run_until_idle(sched, runner, now)
    assert voice.num_cached_tokens == 300 and first_item(runner.plans, voice).start == 300


def test_embedding_inputs_are_never_cached():
    sched, runner = cached(), FakeRunner()
    for _ in range(2):
        sched.add_request(request(SYSTEM, lane="embeddings", kind=Kind.EMBED))
    run_until_idle(sched, runner)
    assert not sched.pools.kv[Pool.EMBED].allocated and not sched.pools.kv[Pool.EMBED].cached
    assert Pool.EMBED not in sched.pools.cache


def test_an_abort_mid_prompt_leaves_what_was_computed():
    sched, runner = cached(max_step_tokens=64), FakeRunner()
    r = request(SYSTEM + list(range(600, 700)))
    sched.add_request(r)
    step(sched, runner, 0.0)
    step(sched, runner, 0.01)
    computed, seq = r.num_computed_tokens, r.seq_id
    assert 0 < computed < 400
    sched.abort(r.request_id, now=0.02)
    plan, _ = step(sched, runner, 0.03)
    assert Drop(seq, computed) in plan.cache_ops[Pool.MAIN]
    assert len(sched.pools.cache[Pool.MAIN].entries[seq].tokens) == computed
    again = request(SYSTEM + list(range(600, 700)), arrival=0.03)
    sched.add_request(again)
    run_until_idle(sched, runner, 0.04)
    assert again.num_cached_tokens == computed and again.finished


def test_off_by_default_in_the_scheduler_and_reads_everything():
    sched, runner = create_scheduler(max_step_ms=1000.0), FakeRunner()
    first = request(SYSTEM)
    sched.add_request(first)
    now = run_until_idle(sched, runner)
    again = request(SYSTEM + [1], arrival=now)
    sched.add_request(again)
    run_until_idle(sched, runner, now)
    assert first_item(runner.plans, again).start == 0 and sched.pools.cells_cached(Pool.MAIN) == 0


def test_requests_arriving_together_read_their_shared_prefix_once():
    sched, runner = create_scheduler(prompt_cache=True, max_step_tokens=64, max_step_ms=1000.0), FakeRunner()  # 64-token chunks
    # SYSTEM public (a lane's configured prompt): three members share it
    members = [request(SYSTEM + [k] * 20, member=f"m{k}", public_len=300) for k in range(3)]
    for r in members:
        sched.add_request(r)
    run_until_idle(sched, runner)
    assert all(r.finished for r in members)
    read = sum(len(i.tokens) for plan in runner.plans for i in plan.items if i.start < 300)
    assert read < 2 * 300, f"the 300-token prefix was read {read / 300:.1f} times"
    assert sorted(r.num_cached_tokens for r in members) == [0, 300, 300]
    copies = [op for plan in runner.plans for op in plan.cache_ops.get(Pool.MAIN, []) if isinstance(op, Copy)]
    assert len(copies) == 2 and all(op.length == 300 for op in copies)


def test_no_kv_slot_drops_every_cached_prefix():
    sched, runner = cached(), FakeRunner()
    for k in range(2):
        sched.add_request(request([k + 1] * 20 + SYSTEM, member=f"m{k}"))
    now = run_until_idle(sched, runner)
    assert len(sched.pools.cache[Pool.MAIN]) == 2
    sched.add_request(request(list(range(5000, 5100)), arrival=now))
    plan = sched.schedule(now + 0.01)
    sched.update(plan, StepResult(no_kv_slot=True), now + 0.02)
    assert not sched.pools.cache[Pool.MAIN] and sched.pools.cells_cached(Pool.MAIN) == 0
    dropped = [op.seq_id for op in sched.pools.take_ops().get(Pool.MAIN, []) if isinstance(op, Drop) and op.start == 0]
    assert len(dropped) == 2


def test_an_entry_goes_once_keeping_it_has_cost_more_than_reading_it_again():
    """Keeping cells costs every token the pool computes (attention spans them); reading them
    again costs each token once: past p·(1000·b/c + L/2) tokens of other work, an unused entry goes. Work in
    the other pool, or no work at all, costs it nothing."""
    def cost(shape):  # 2 ms a token, 1 ms a token per thousand cells
        return 11.0 + 2.0 * shape.tokens + 1.0 * shape.token_kcells + shape.outputs

    sched, runner = cached(num_cells=20000, interactive_cells=20000), FakeRunner(cost=cost)

    def keep():
        _, b, c, _ = sched.cost.coefficients
        return sched.pools.settings.reuse_odds * (1000 * b / c + len(SYSTEM + [1]) / 2)

    chat = request(SYSTEM + [1], max_tokens=2)
    sched.add_request(chat)
    now = run_until_idle(sched, runner)
    first = next(iter(sched.pools.cache[Pool.INTERACTIVE].entries))
    # background work in the main pool: the chat's entry in its own cache does not age
    sched.add_request(request(list(range(6000, 9000)), lane="summaries", max_tokens=2, arrival=now))
    now = run_until_idle(sched, runner, now)
    assert first in sched.pools.cache[Pool.INTERACTIVE].entries
    # other chats in its own cache: once they have computed more than `keep` tokens, it goes
    work, seen = 0, []
    while first in sched.pools.cache[Pool.INTERACTIVE].entries:
        other = request([9000 + work] * 20 + list(range(480)), member=f"o{work}", max_tokens=2, arrival=now)
        sched.add_request(other)
        now = run_until_idle(sched, runner, now)
        work += other.num_computed_tokens
        seen.append(keep())
        assert work < max(seen) + 1000, "kept past its worth"
    assert work > min(seen) - 1000, "evicted before it had cost its worth"


def test_a_members_many_entries_share_the_odds_of_reuse():
    """Only its member reuses an entry, and a member goes on with one conversation at a time: one of
    alice's two conversations leaves after about half the work bob's one stays through (a flood's
    many entries leave soon, and do not slow everyone's steps for long)."""
    def cost(shape):
        return 11.0 + 2.0 * shape.tokens + 1.0 * shape.token_kcells + shape.outputs

    sched, runner = cached(num_cells=20000, interactive_cells=20000), FakeRunner(cost=cost)
    entries = sched.pools.cache[Pool.INTERACTIVE].entries
    now = 0.0
    for i, member in enumerate(("alice", "alice", "bob")):
        sched.add_request(request([5000 + i] + SYSTEM[:100], member=member, max_tokens=2, arrival=now))
        now = run_until_idle(sched, runner, now)
    assert sorted(e.member for e in entries.values()) == ["alice", "alice", "bob"]
    work, gone = 0, {}
    while len(gone) < 2 and work < 20000:
        other = request([9000 + work] * 20 + list(range(80)), member=f"o{work}", max_tokens=2, arrival=now)
        sched.add_request(other)
        now = run_until_idle(sched, runner, now)
        work += other.num_computed_tokens
        for member, held in (("alice", 2), ("bob", 1)):  # the work until one of theirs goes
            if member not in gone and sum(e.member == member for e in entries.values()) < held:
                gone[member] = work
    assert gone["alice"] < 0.75 * gone["bob"], gone


def test_a_shared_cache_keeps_every_entrys_odds():
    """With `prompt_cache_shared` anyone may reuse any entry: a member's many entries keep theirs."""
    sched, runner = cached(num_cells=20000, interactive_cells=20000, prompt_cache_shared=True), FakeRunner()
    for i in range(8):
        sched.add_request(request([5000 + i] + SYSTEM, max_tokens=2))
    now = run_until_idle(sched, runner)
    other = request([9000] * 20 + list(range(200)), member="o", max_tokens=2, arrival=now)
    sched.add_request(other)
    run_until_idle(sched, runner, now)
    assert sum(e.member == "alice" for e in sched.pools.cache[Pool.INTERACTIVE].entries.values()) == 8


# ---- whose cells a request may reuse ------------------------------------------------------------

PIN_SENTENCE = list(range(2000, 2040))  # "My bank PIN is" ... as tokens: the secret sits at 2040
AFTER = list(range(3000, 3030))  # "... and my doctor said ..."


def pin_prompt(pin: list[int], public: int = 0) -> list[int]:
    return SYSTEM[:public] + PIN_SENTENCE + pin + AFTER


def run_one(sched, runner, r, now):
    sched.add_request(r)
    now = run_until_idle(sched, runner, now)
    assert r.finished
    return now


def test_another_members_private_prefix_is_never_reused():
    """The PIN probe: alice's guesses read as much of their prompt whether or not bob sent it."""
    sched, runner = cached(), FakeRunner()
    now = run_one(sched, runner, request(pin_prompt([4, 8, 3, 1]), member="bob", max_tokens=1), 0.0)
    warm = request(pin_prompt([9, 9, 9, 9]), member="alice", max_tokens=1, arrival=now)
    now = run_one(sched, runner, warm, now)
    assert warm.num_cached_tokens == 0, "nothing of bob's reached alice"
    right = request(pin_prompt([4, 8, 3, 1]), member="alice", max_tokens=1, arrival=now)
    now = run_one(sched, runner, right, now)
    wrong = request(pin_prompt([7, 8, 3, 2]), member="alice", max_tokens=1, arrival=now)
    run_one(sched, runner, wrong, now)
    assert right.num_cached_tokens == wrong.num_cached_tokens == len(PIN_SENTENCE), \
        "each guess reused only alice's own warm-up, up to the PIN"
    assert first_item(runner.plans, right).start == first_item(runner.plans, wrong).start == len(PIN_SENTENCE)
    assert not any(isinstance(op, Copy) for plan in runner.plans for op in plan.cache_ops.get(Pool.MAIN, []))


def test_only_the_public_part_is_reused_across_members():
    sched, runner = cached(), FakeRunner()
    bob = request(pin_prompt([4, 8, 3, 1], public=300), member="bob", max_tokens=1, public_len=300)
    now = run_one(sched, runner, bob, 0.0)
    bob_seq = next(iter(sched.pools.cache[Pool.MAIN].entries))
    guess = request(pin_prompt([4, 8, 3, 1], public=300), member="alice", max_tokens=1, arrival=now,
                    public_len=300)
    sched.add_request(guess)
    plan, _ = step(sched, runner, now + 0.01)
    copies = [op for op in plan.cache_ops[Pool.MAIN] if isinstance(op, Copy)]
    assert [(op.src, op.length) for op in copies] == [(bob_seq, 300)], "the public 300 shared, not taken over"
    assert len(sched.pools.cache[Pool.MAIN].entries[bob_seq].tokens) == bob.num_computed_tokens, \
        "bob's entry keeps its private tail for his own next turn"
    run_until_idle(sched, runner, now + 0.02)
    assert guess.num_cached_tokens == 300 and first_item(runner.plans, guess).start == 300
    # the public part counts only as far as both requests' own public_len says
    again = request(pin_prompt([4, 8, 3, 1], public=300), member="carol", max_tokens=1, arrival=now + 1,
                    public_len=100)
    run_one(sched, runner, again, now + 1)
    assert again.num_cached_tokens == 100


def test_a_member_reuses_its_own_private_prefix():
    sched, runner = cached(), FakeRunner()
    first = request(pin_prompt([4, 8, 3, 1]), member="bob", max_tokens=1)
    now = run_one(sched, runner, first, 0.0)
    again = request(pin_prompt([4, 8, 3, 1]) + [5, 6], member="bob", max_tokens=1, arrival=now)
    run_one(sched, runner, again, now)
    assert again.num_cached_tokens == first.num_prompt_tokens


def test_a_live_sequence_of_another_member_is_not_shared_or_waited_for():
    sched, runner = cached(max_step_tokens=64), FakeRunner()  # 64-token chunks: bob reads for several steps
    bob = request(SYSTEM + [1], member="bob", max_tokens=20)
    alice = request(SYSTEM + [2], member="alice", max_tokens=1)
    sched.add_request(bob)
    step(sched, runner, 0.0)
    assert not sched.pools.shares_a_prefix_being_read(alice), "alice does not wait on bob's private prompt"
    sched.add_request(alice)
    run_until_idle(sched, runner, 0.01)
    assert alice.num_cached_tokens == 0 and first_item(runner.plans, alice).start == 0
    assert not any(isinstance(op, Copy) for plan in runner.plans for op in plan.cache_ops.get(Pool.MAIN, []))


def test_one_members_requests_arriving_together_read_their_private_prefix_once():
    sched, runner = create_scheduler(prompt_cache=True, max_step_tokens=64), FakeRunner()
    mine = [request(SYSTEM + [k] * 20, member="bob") for k in range(3)]
    other = request(SYSTEM + [9] * 20, member="alice")
    for r in [*mine, other]:
        sched.add_request(r)
    run_until_idle(sched, runner)
    assert sorted(r.num_cached_tokens for r in mine) == [0, 300, 300] and other.num_cached_tokens == 0
    read = sum(len(i.tokens) for plan in runner.plans for i in plan.items if i.start < 300)
    assert 2 * 300 <= read < 3 * 300, "bob's prefix read once, alice's own once"


def test_the_shared_opt_in_reuses_every_members_prefixes():
    sched, runner = cached(prompt_cache_shared=True), FakeRunner()
    now = run_one(sched, runner, request(pin_prompt([4, 8, 3, 1]), member="bob", max_tokens=1), 0.0)
    right = request(pin_prompt([4, 8, 3, 1]), member="alice", max_tokens=1, arrival=now)
    now = run_one(sched, runner, right, now)
    wrong = request(pin_prompt([7, 8, 3, 2]), member="carol", max_tokens=1, arrival=now)
    run_one(sched, runner, wrong, now)
    assert right.num_cached_tokens == right.num_prompt_tokens - 1, "bob's whole prompt reused: what the opt-in allows"
    assert wrong.num_cached_tokens == len(PIN_SENTENCE)
