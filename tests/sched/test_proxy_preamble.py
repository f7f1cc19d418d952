"""A trusted proxy's preamble in the prompt cache (issue 54): the users of one proxy member (Open
WebUI's people, keys `owui/<user>`) reuse each other's cells as far as the client wrote them
(`Request.client_len`: its tools and system text), and from the first token a user wrote on, only
their own; another member, or another proxy's user, only `public_len`. Eviction keeps the preamble
while its users come back: the last entry holding it is cut to it rather than dropped.

Checked with the fake runner's position bookkeeping (every cache operation must leave each
sequence's cells where its next item starts), as tests/sched/test_prefix_cache.py does."""

from __future__ import annotations

import itertools

from homeai.sched.pools import Copy, Drop, Pool
from homeai.sched.prefix import reusable
from homeai.sched.request import Request, SamplingParams
from tests.sched.helpers import FakeRunner, create_scheduler, run_until_idle, step

_ids = itertools.count()
PUBLIC = 20  # the template's opening and a lane's configured prompt: no member wrote them
PREAMBLE = list(range(100, 400))  # 300 leading tokens: PUBLIC, then the client's tools and system text
CLIENT = len(PREAMBLE)
PIN_SENTENCE = list(range(2000, 2040))  # a user's "My bank PIN is" ...: the secret sits after it
AFTER = list(range(3000, 3030))


def ask(prompt, member, group="owui", max_tokens=1, arrival=0.0, client_len=CLIENT, lane="chat") -> Request:
    """A request of `member`; through the proxy `group` ("" for none), its first `client_len` the client's."""
    return Request(f"q{next(_ids)}", lane, member, list(prompt), arrival, params=SamplingParams(max_tokens=max_tokens),
                   public_len=PUBLIC, group=group, client_len=client_len if group else PUBLIC)


def pin(digits) -> list[int]:
    return PREAMBLE + PIN_SENTENCE + list(digits) + AFTER


def cached(**overrides):
    return create_scheduler(prompt_cache=True, max_step_ms=1000.0, **overrides)


def run_one(sched, runner, r, now):
    sched.add_request(r)
    now = run_until_idle(sched, runner, now)
    assert r.finished
    return now


def first_item(runner, r):
    return next(i for plan in runner.plans for i in plan.items if i.request_id == r.request_id)


def copies(runner, pool=Pool.MAIN):
    return [op for plan in runner.plans for op in plan.cache_ops.get(pool, []) if isinstance(op, Copy)]


def test_the_rule_has_three_levels():
    same = dict(maker_public=PUBLIC, public_len=PUBLIC, maker_client=CLIENT, client_len=CLIENT)
    assert reusable(500, same_member=True, **same) == 500
    assert reusable(500, same_member=False, same_group=True, **same) == CLIENT
    assert reusable(500, same_member=False, same_group=False, **same) == PUBLIC
    assert reusable(500, same_member=False, same_group=True, maker_public=PUBLIC, public_len=PUBLIC,
                    maker_client=CLIENT, client_len=120) == 120, "the shorter client prefix of the two"
    assert reusable(100, same_member=False, same_group=True, **same) == 100, "a shorter match, as it is"


def test_a_users_probe_reads_none_of_another_users_message():
    """Issue 26's PIN probe, user against user behind one proxy: bob's guesses find the client's
    preamble from alice's cells and his own warm-up up to the PIN, never alice's sentence."""
    sched, runner = cached(), FakeRunner()
    now = run_one(sched, runner, ask(pin([4, 8, 3, 1]), "owui/alice"), 0.0)
    warm = ask(pin([9, 9, 9, 9]), "owui/bob", arrival=now)
    now = run_one(sched, runner, warm, now)
    assert warm.num_cached_tokens == CLIENT and first_item(runner, warm).start == CLIENT, \
        "the client's preamble came from alice's cells, and nothing after it"
    right = ask(pin([4, 8, 3, 1]), "owui/bob", arrival=now)
    now = run_one(sched, runner, right, now)
    wrong = ask(pin([7, 8, 3, 2]), "owui/bob", arrival=now)
    run_one(sched, runner, wrong, now)
    assert right.num_cached_tokens == wrong.num_cached_tokens == CLIENT + len(PIN_SENTENCE), \
        "each guess reused the preamble and bob's own warm-up, up to the PIN"
    assert first_item(runner, right).start == first_item(runner, wrong).start


def test_another_member_and_another_proxys_user_get_the_public_part_only():
    sched, runner = cached(), FakeRunner()
    now = run_one(sched, runner, ask(pin([4, 8, 3, 1]), "owui/alice"), 0.0)
    for member, group in (("bob", ""), ("other/alice", "other"), ("owui", "")):  # a member named like it, no flag
        probe = ask(pin([4, 8, 3, 1]), member, group=group, arrival=now)
        now = run_one(sched, runner, probe, now)
        assert probe.num_cached_tokens == PUBLIC, (member, probe.num_cached_tokens)


def test_a_non_proxy_members_cells_stay_its_own_whatever_the_client_wrote():
    """client_len means nothing without a proxy: two members sending the same tools share only the public part."""
    sched, runner = cached(), FakeRunner()
    now = run_one(sched, runner, ask(pin([4, 8, 3, 1]), "alice", group=""), 0.0)
    bob = ask(pin([1, 1, 1, 1]), "bob", group="", arrival=now)
    run_one(sched, runner, bob, now)
    assert bob.num_cached_tokens == PUBLIC


def test_another_users_entry_is_shared_not_taken_over_and_a_preamble_alone_is_taken():
    sched, runner = cached(num_cells=1000), FakeRunner()
    alice = ask(pin([4, 8, 3, 1]), "owui/alice")
    now = run_one(sched, runner, alice, 0.0)
    entries = sched.pools.cache[Pool.MAIN].entries
    (alice_seq, _), = entries.items()
    bob = ask(PREAMBLE + [7, 7, 7], "owui/bob", max_tokens=4, arrival=now)
    sched.add_request(bob)
    plan, _ = step(sched, runner, now + 0.01)
    assert Copy(alice_seq, bob.seq_id, CLIENT) in plan.cache_ops[Pool.MAIN] and bob.seq_id != alice_seq
    assert len(entries[alice_seq].tokens) == alice.num_computed_tokens, "alice keeps her own tail"
    now = run_until_idle(sched, runner, now + 0.02)
    for _ in range(2):  # room wanted: alice's entry goes (bob's holds the preamble), then bob's is cut to it
        sched.pools._evict_oldest(Pool.MAIN)
    (preamble_seq, preamble), = entries.items()
    assert preamble.member == "owui/bob" and preamble.preamble_only
    carol = ask(PREAMBLE + [5, 5, 5], "owui/carol", max_tokens=4, arrival=now)
    sched.add_request(carol)
    step(sched, runner, now + 0.01)
    assert carol.seq_id == preamble_seq and not entries, "the preamble alone became carol's sequence"
    run_until_idle(sched, runner, now + 0.02)
    assert carol.num_cached_tokens == CLIENT


def test_users_arriving_together_read_the_preamble_once():
    sched, runner = create_scheduler(prompt_cache=True, max_step_tokens=64, max_step_ms=1000.0), FakeRunner()  # 64-token chunks
    users = [ask(PREAMBLE + [k] * 20, f"owui/u{k}") for k in range(3)]
    for r in users:
        sched.add_request(r)
    run_until_idle(sched, runner)
    assert all(r.finished for r in users)
    read = sum(len(i.tokens) for plan in runner.plans for i in plan.items if i.start < CLIENT)
    assert read < 2 * CLIENT, f"the preamble was read {read / CLIENT:.1f} times"
    assert sorted(r.num_cached_tokens for r in users) == [0, CLIENT, CLIENT]
    assert len(copies(runner)) == 2 and all(op.length == CLIENT for op in copies(runner))


def test_users_arriving_together_share_the_preamble_in_a_cache_that_holds_one():
    """Open WebUI's two users at once, with an interactive cache that holds one preamble: the second
    waits for the first's read, then borrows its cells there (its own text is all it needs), rather
    than read the preamble again in the main cache beside it (each slowing the other's)."""
    sched, runner = create_scheduler(prompt_cache=True, max_step_tokens=64, num_cells=1000, num_seqs=4,
                                     interactive_cells=400, max_step_ms=1000.0), FakeRunner()  # 64-token chunks
    alice, bob = (ask(PREAMBLE + [k] * 20, f"owui/{name}", max_tokens=4) for k, name in ((1, "alice"), (2, "bob")))
    for r in (alice, bob):
        sched.add_request(r)
    run_until_idle(sched, runner)
    assert alice.finished and bob.finished
    assert alice.pool is bob.pool is Pool.INTERACTIVE, (alice.pool, bob.pool)
    assert sorted(r.num_cached_tokens for r in (alice, bob)) == [0, CLIENT]
    read = sum(len(i.tokens) for plan in runner.plans for i in plan.items if i.start < CLIENT)
    assert read < 2 * CLIENT, f"the preamble was read {read / CLIENT:.1f} times"


def test_a_user_still_reading_private_text_is_not_waited_for():
    sched, runner = cached(max_step_tokens=64), FakeRunner()
    alice = ask(PREAMBLE + list(range(5000, 5200)), "owui/alice", max_tokens=4)
    sched.add_request(alice)
    for k in range(6):  # the preamble read, her own text still being read
        step(sched, runner, 0.01 * k)
    assert CLIENT < alice.num_computed_tokens < alice.num_prompt_tokens
    same_text = ask(PREAMBLE + list(range(5000, 5200)), "owui/bob")
    assert not sched.pools.shares_a_prefix_being_read(same_text), "bob waits for no more than the preamble"


def fill(sched, runner, member, now, group="owui", tail=200):
    """A conversation of `member` (the preamble, then `tail` tokens of its own) left in the cache."""
    r = ask(PREAMBLE + [hash(member) % 500 + 5000] * tail, member, group=group, max_tokens=4, arrival=now)
    return run_one(sched, runner, r, now), r


def slow_to_expire(shape):
    """Steps whose attention over cached cells costs next to nothing: `expire` keeps entries for long."""
    return 11.0 + 2.0 * shape.tokens + 0.001 * shape.token_kcells + shape.outputs


def test_eviction_cuts_the_last_holder_to_the_preamble():
    """Another member's prompt needs the room: the proxy user's entry loses its own tail and keeps the
    client's preamble, which the next user reuses; a non-proxy member's entry goes whole."""
    for group, kept in (("owui", CLIENT), ("", 0)):
        sched, runner = cached(num_cells=1000), FakeRunner(cost=slow_to_expire)
        now, alice = fill(sched, runner, "owui/alice" if group else "alice", 0.0, group=group)
        (seq, entry), = sched.pools.cache[Pool.MAIN].entries.items()
        assert len(entry.tokens) == alice.num_computed_tokens > 500
        big = ask(list(range(7000, 7560)), "bob", group="", max_tokens=4, arrival=now)  # 564 cells: 68 more than free
        sched.add_request(big)
        plan, _ = step(sched, runner, now + 0.01)
        entries = sched.pools.cache[Pool.MAIN].entries
        if kept:
            assert Drop(seq, CLIENT) in plan.cache_ops[Pool.MAIN] and len(entries[seq].tokens) == CLIENT
        else:
            assert Drop(seq) in plan.cache_ops[Pool.MAIN] and seq not in entries
        now = run_until_idle(sched, runner, now + 0.02)
        carol = ask(PREAMBLE + [5, 5, 5], "owui/carol" if group else "carol", group=group, arrival=now)
        run_one(sched, runner, carol, now)
        assert carol.num_cached_tokens == (CLIENT if kept else 0)


def test_an_entry_that_is_not_the_last_holder_goes_whole():
    sched, runner = cached(num_cells=1200), FakeRunner()
    now, alice = fill(sched, runner, "owui/alice", 0.0)
    now, bob = fill(sched, runner, "owui/bob", now)  # his entry borrows the preamble from alice's
    entries = sched.pools.cache[Pool.MAIN].entries
    assert len(entries) == 2
    alice_seq = next(s for s, e in entries.items() if e.member == "owui/alice")
    sched.pools._evict_oldest(Pool.MAIN)  # alice's is the oldest: bob's holds the preamble too
    assert alice_seq not in entries and len(entries) == 1
    sched.pools._evict_oldest(Pool.MAIN)  # bob's is now the last holder: cut, not dropped
    (entry,) = entries.values()
    assert entry.member == "owui/bob" and len(entry.tokens) == CLIENT and entry.preamble_only
    sched.pools._evict_oldest(Pool.MAIN)  # a preamble alone goes whole when room is wanted
    assert not entries and sched.pools.cells_cached(Pool.MAIN) == 0


def test_the_preamble_stays_while_the_proxys_users_come_and_goes_when_they_stop():
    """`expire`: alice's conversation, not reused while other members work, goes once it has cost
    more than it would save; while other users of her proxy keep coming to the pool (bob's short
    tasks, which share no prefix with her), its preamble stays, cut from it, and counts its keep from
    the proxy's latest request; once they stop, it goes too. A non-proxy member's goes whole."""
    def cost(shape):  # 2 ms a token, 1 ms a token per thousand cells
        return 11.0 + 2.0 * shape.tokens + 1.0 * shape.token_kcells + shape.outputs

    for group in ("owui", ""):
        sched, runner = cached(num_cells=20000, interactive_cells=20000), FakeRunner(cost=cost)
        entries = sched.pools.cache[Pool.INTERACTIVE].entries
        member = "owui/alice" if group else "alice"
        now, _ = fill(sched, runner, member, 0.0, group=group)
        work, cut, gone, rounds = 0, None, None, 0
        while gone is None and work < 60000:
            rounds += 1
            if cut is None or rounds < 30:  # bob keeps coming until some while after her tail went
                task = ask([8000 + rounds] * 40, "owui/bob", client_len=PUBLIC, arrival=now)
                now = run_one(sched, runner, task, now)
            other = ask([9000 + rounds] * 20 + list(range(480)), f"o{rounds}", group="", max_tokens=2, arrival=now)
            now = run_one(sched, runner, other, now)
            work += other.num_computed_tokens
            mine = [e for e in entries.values() if e.member == member]
            if cut is None and (not mine or len(mine[0].tokens) <= CLIENT):
                cut = rounds
                assert [len(e.tokens) for e in mine] == ([CLIENT] if group else []), "her tail went, not the preamble"
            if not mine:
                gone = rounds
        assert cut is not None and gone is not None, (cut, gone)
        if group:
            assert gone > 30, "the preamble stayed while bob came"
            assert gone < 60, "and went once he stopped"
        else:
            assert gone == cut
