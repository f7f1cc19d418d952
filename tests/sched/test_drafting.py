"""Drafting in the pure scheduler (`homeai.sched.draft`): guesses from the request's own tokens,
placed in a decode's row within the step, settled as the runner checked them, charged as they ran,
and learnt per member. The fake model here echoes: the token after position p is the prompt's
token at p modulo its length, so a prompt's own n-grams guess it right until the echo wraps."""

from __future__ import annotations

import numpy as np
import pytest

from homeai.sched.costmodel import StepShape
from homeai.sched.draft import PROBE_EVERY, Acceptance, DraftSettings, Drafting, Lookup, expected_tokens
from homeai.sched.pools import Pool
from homeai.sched.prefix import Memory
from homeai.sched.request import Request, Sample, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits, StepResult
from lanes import DEFAULT_POLICIES
from tests.sched.helpers import FakeRunner, cpu_ms, create_request, taught

ON = DraftSettings(enabled=True, max_draft=8, lanes=frozenset({"voice", "chat"}))


def scheduler(drafting=ON, memory=Memory(), **overrides) -> Scheduler:
    limits = dict(num_cells=4096, num_seqs=16, max_step_tokens=256, embed_max_tokens=512, embed_max_seqs=16, min_chunk=8)
    limits.update(overrides)
    return taught(Scheduler(dict(DEFAULT_POLICIES), SchedulerLimits(**limits), memory=memory, drafting=drafting), cpu_ms)


class EchoRunner(FakeRunner):
    """The fake model echoes each request's prompt (`echo`), or answers with `wrong` to every guess;
    a drafted row is checked as the runner checks one: picks while they equal the guesses, then one more."""

    def __init__(self, wrong: bool = False):
        super().__init__(cost=cpu_ms)
        self.prompts: dict[str, list[int]] = {}
        self.wrong = wrong

    def token(self, request_id: str, position: int) -> int:
        prompt = self.prompts[request_id]
        return prompt[position % len(prompt)]

    def run(self, plan):
        drafts = plan.drafts
        for pool in (Pool.INTERACTIVE, Pool.MAIN):
            for item in plan.batches[pool]:
                if item.request_id in drafts:
                    assert item.tokens[1:] == drafts[item.request_id], "a row carries its draft after its token"
        result = super().run(plan)
        for pool in (Pool.INTERACTIVE, Pool.MAIN):
            for item in plan.batches[pool]:
                if not item.sample:
                    continue
                guess = drafts.get(item.request_id)
                if guess is None:
                    result.samples[item.request_id] = Sample(self.token(item.request_id, item.start + len(item.tokens)))
                    continue
                accepted = []
                for i in range(len(guess) + 1):
                    pick = self.token(item.request_id, item.start + 1 + i)
                    if self.wrong and i < len(guess):
                        pick = guess[i] + 1
                    if i == len(guess) or pick != guess[i]:
                        break
                    accepted.append(Sample(pick))
                result.samples[item.request_id] = Sample(pick)
                result.accepted[item.request_id] = accepted
                self.positions[pool, item.seq_id] = item.start + 1 + len(accepted)  # the runner cuts the rest
        return result


def echo_request(runner: EchoRunner, lane="chat", member="alice", max_tokens=40, num_prompt=60) -> Request:
    request = create_request(lane=lane, member=member, num_prompt=num_prompt, max_tokens=max_tokens)
    request.prompt_tokens = list(range(100, 100 + num_prompt))  # no n-gram twice: the echo is guessed right
    request.params = SamplingParams(temperature=0, max_tokens=max_tokens)
    runner.prompts[request.request_id] = request.prompt_tokens
    return request


def drain(sched: Scheduler, runner: EchoRunner, now: float = 0.0):
    plans = []
    while sched.has_work():
        plan = sched.schedule(now)
        result = runner.run(plan)
        now += result.elapsed_ms / 1000
        sched.update(plan, result, now)
        plans.append(plan)
        if plan.empty:  # a lane's batching window: on to when its request is eligible
            now = max(now + 0.001, sched.next_wakeup(now) or now)
        assert len(plans) < 5000
    return plans


# ---- the pure parts --------------------------------------------------------------------------


def test_a_guess_is_what_followed_the_longest_recent_ngram():
    lookup = Lookup()
    assert lookup.guess([1, 2, 3, 4, 5, 6, 7, 1, 2, 3], [], 3) == [4, 5, 6]
    assert Lookup().guess([5, 1, 2, 9, 1, 2, 8, 0, 1, 2], [], 1) == [8], "the latest occurrence wins"
    assert Lookup().guess([9, 3, 4, 1, 2, 3, 4, 5, 8, 3, 4], [], 1) == [5], "the longest n-gram first (8 3 4: no; 3 4: latest)"
    assert Lookup().guess([2, 3, 4, 7, 5, 3, 4, 6, 2, 3, 4], [], 1) == [7], "2 3 4 was followed by 7, 3 4 last by 6"
    assert Lookup().guess([1, 2, 3, 4], [], 4) == [], "nothing repeats: no guess"


def test_a_lookup_grows_with_the_answer():
    lookup = Lookup()
    prompt = [10, 11, 12, 13, 14, 15, 16]
    assert lookup.guess(prompt, [], 4) == []
    assert lookup.guess(prompt, [12, 13], 3) == [14, 15, 16], "the answer's tokens join the lookup"
    assert lookup.guess(prompt, [12, 13, 14, 15, 16, 12, 13], 2) == [14, 15]


def test_the_length_follows_acceptance_and_the_step_cost():
    drafting, sched = Drafting(ON), scheduler()
    base = StepShape(1, 1, 0.5, 1)
    keen, poor = ("chat", "keen"), ("chat", "poor")
    drafting.pairs[keen] = Acceptance(accepted=[19.0, 19.0], trials=[20.0, 20.0])
    drafting.pairs[poor] = Acceptance(accepted=[1.0, 1.0], trials=[20.0, 20.0])
    assert drafting.length(keen, "r", sched.cost, base, 500, 8, 1e9) >= 4, "a member whose guesses hold drafts long"
    assert drafting.length(poor, "r", sched.cost, base, 500, 8, 1e9) == 0, "guesses that fail do not pay"
    assert drafting.length(keen, "r", sched.cost, base, 500, 2, 1e9) == 2, "never past the room"
    limit = sched.cost.predict_ms(base.plus(StepShape(0, 2, 1.0, 0)))
    assert drafting.length(keen, "r", sched.cost, base, 500, 8, limit) == 2, "nor past the step's time limit"


def test_a_run_of_accepted_drafts_is_believed_apart():
    drafting, key = Drafting(ON), ("chat", "alice")
    drafting.learn(key, "r", drafted=4, accepted=4)
    assert "r" in drafting.runs
    for _ in range(30):
        drafting.learn(key, "r", drafted=4, accepted=4)  # a quote going on
        drafting.learn(key, "s", drafted=4, accepted=0)  # fresh guesses failing
    pair = drafting.pairs[key]
    assert pair.rate(run=True) > 0.95 and pair.rate(run=False) < 0.1
    assert "s" not in drafting.runs
    drafting.forget("r")
    assert "r" not in drafting.runs and "r" not in drafting.lookups


def test_a_pair_that_stopped_drafting_tries_again_now_and_then():
    drafting, sched = Drafting(ON), scheduler()
    drafting.pairs[("chat", "a")] = Acceptance(accepted=[0.0, 0.0], trials=[50.0, 50.0])
    lengths = [drafting.length(("chat", "a"), "r", sched.cost, StepShape(1, 1, 0.5, 1), 500, 8, 1e9)
               for _ in range(2 * PROBE_EVERY)]
    assert lengths.count(0) == 2 * PROBE_EVERY - 2 and max(lengths) == 2


def test_acceptance_is_learnt_from_what_was_checked():
    pair = Acceptance()
    for _ in range(40):
        pair.learn(drafted=4, accepted=1)  # one accepted, the second refused, two never checked
    assert pair.rate() == pytest.approx(0.5, abs=0.02)
    assert (pair.drafted, pair.accepted_total) == (160, 40)
    assert expected_tokens(0.5, 2) == 1.75


# ---- in the scheduler ------------------------------------------------------------------------


def test_an_echoing_answer_takes_fewer_steps_and_is_the_same_answer():
    outputs, steps = {}, {}
    for drafting in (DraftSettings(), ON):
        sched, runner = scheduler(drafting), EchoRunner()
        request = echo_request(runner)
        sched.add_request(request)
        plans = drain(sched, runner)
        outputs[drafting.enabled], steps[drafting.enabled] = list(request.output_tokens), len(plans)
        assert request.finish_reason == "length" and len(request.output_tokens) == 40
    assert outputs[True] == outputs[False]
    assert steps[True] * 3 < steps[False], steps


def test_drafts_never_run_past_the_answers_last_token():
    for max_tokens in range(1, 12):
        sched, runner = scheduler(), EchoRunner()
        request = echo_request(runner, max_tokens=max_tokens)
        sched.add_request(request)
        drain(sched, runner)
        assert len(request.output_tokens) == max_tokens


def test_refused_guesses_are_charged_as_they_ran_and_taught():
    sched, runner = scheduler(), EchoRunner(wrong=True)
    request = echo_request(runner, max_tokens=60)
    sched.add_request(request)
    plans = drain(sched, runner)
    drafted = sum(p.num_drafted for p in plans)
    pair = sched.drafting.pairs[("chat", "alice")]
    assert drafted > 0 and pair.drafted == drafted and pair.accepted_total == 0
    assert pair.length == 0, "guesses that all fail stop being drafted"
    assert drafted < 60, "and most steps drafted nothing"
    plain, _ = scheduler(DraftSettings()), None
    plain_runner = EchoRunner(wrong=True)
    plain.add_request(echo_request(plain_runner, max_tokens=60))
    drain(plain, plain_runner)
    output_cost = sched.fair.output_cost(DEFAULT_POLICIES["chat"].weight)
    extra = sched.fair.counters[("chat", "alice")] - plain.fair.counters[("chat", "alice")]
    assert extra == pytest.approx(output_cost * drafted), "every drafted row is charged, accepted or not"


def test_fair_share_charges_the_same_with_guesses_accepted():
    charged = {}
    for drafting in (DraftSettings(), ON):
        sched, runner = scheduler(drafting), EchoRunner()
        sched.add_request(echo_request(runner))
        drain(sched, runner)
        charged[drafting.enabled] = sched.fair.counters[("chat", "alice")]
    assert charged[True] >= charged[False]
    assert charged[True] - charged[False] < 0.2 * charged[False], "accepted guesses cost what their tokens would"


def test_background_lanes_and_windowed_models_draft_nothing():
    sched, runner = scheduler(), EchoRunner()
    sched.add_request(echo_request(runner, lane="summaries"))
    assert sum(p.num_drafted for p in drain(sched, runner)) == 0
    sched, runner = scheduler(memory=Memory(window=512)), EchoRunner()
    sched.add_request(echo_request(runner))
    assert not sched.drafting.settings.enabled
    assert sum(p.num_drafted for p in drain(sched, runner)) == 0


def test_no_guess_while_an_interactive_prompt_waits_to_be_read():
    sched, runner = scheduler(max_step_tokens=64), EchoRunner()
    first = echo_request(runner, max_tokens=200)
    sched.add_request(first)
    now = 0.0
    while not first.output_tokens:
        plan = sched.schedule(now)
        now += 0.02
        sched.update(plan, runner.run(plan), now)
    second = echo_request(runner, member="bob", num_prompt=600)
    sched.add_request(second)
    while second.num_computed_tokens < len(second.prompt_tokens) and not second.finished:
        plan = sched.schedule(now)
        now += 0.02
        if any(i.request_id == second.request_id for i in plan.items) or second.status.value == "waiting":
            assert not plan.drafts, "a guess took room from a question being read"
        sched.update(plan, runner.run(plan), now)


def test_guesses_never_take_cells_from_anyone():
    sched, runner = scheduler(num_cells=70, interactive_cells=0), EchoRunner()
    request = echo_request(runner, max_tokens=9, num_prompt=60)  # 69 cells: room for one token at a time at the end
    sched.add_request(request)
    drain(sched, runner)
    assert len(request.output_tokens) == 9 and request.num_preemptions == 0


def test_a_guess_that_would_take_a_background_chunks_place_must_win_more_than_it_takes():
    drafting, sched = Drafting(ON), scheduler()
    key = ("chat", "alice")
    drafting.pairs[key] = Acceptance(accepted=[12.0, 12.0], trials=[20.0, 20.0])  # 60% of guesses held
    base = StepShape(1, 1, 0.5, 1)
    assert drafting.length(key, "r", sched.cost, base, 500, 8, 1e9) >= 1, "with room to spare, it pays"
    assert drafting.length(key, "r", sched.cost, base, 500, 8, 1e9, displaced=1.0) == 0, \
        "each token a background token of the same weight: a 60% guess never wins one back"
    assert drafting.length(key, "r", sched.cost, base, 500, 8, 1e9, displaced=0.25) == 2, \
        "voice's weight is four times background's: two tokens gain 0.96 for 0.5 displaced"


def test_background_waiting_makes_guesses_pay_their_way():
    sched, runner = scheduler(), EchoRunner(wrong=True)
    talker = echo_request(runner, max_tokens=60)
    sched.add_request(talker)
    for n in range(3):
        sched.add_request(echo_request(runner, lane="summaries", member=f"indexer{n}", num_prompt=3000, max_tokens=4))
    # 40% of guesses held: a chat token is worth two background tokens, so a guess would gain 0.4 for 0.5
    sched.drafting.pairs[talker.key] = Acceptance(accepted=[8.0, 8.0], trials=[20.0, 20.0])
    plans = drain(sched, runner)
    chunked = [p for p in plans if any(i.request_id != talker.request_id and len(i.tokens) > 1 for i in p.items)]
    assert chunked and sum(p.num_drafted for p in chunked) == 0, "a 40% guess took a background chunk's place"


def test_a_member_earlier_turns_in_the_prompt_cache_guess_for_them_and_nobody_else():
    """A new conversation whose answer repeats what an earlier one of the member's said: its own tokens
    guess nothing, the member's cached turn does. Another member's request finds nothing there."""
    drafting = Drafting(ON)
    earlier = np.array([5, 6, 7, 8, 9, 10, 11, 12], dtype=np.int32)
    history = [(("interactive", 3), earlier)]
    assert drafting.guess("new", [1, 2], [7, 8], lambda: history) == [9, 10, 11, 12]
    assert drafting.guess("own", [7, 8, 1, 7, 8], [], lambda: history) == [1, 7, 8], "its own tokens first"
    sched, runner = scheduler(prompt_cache=True), EchoRunner()
    first = echo_request(runner, max_tokens=8)
    sched.add_request(first)
    drain(sched, runner)
    assert sched.pools.history(first, 4), "alice's turn stays cached"
    bob = create_request(member="bob")
    assert sched.pools.history(bob, 4) == [], "bob's history holds none of alice's turns"
    alice = create_request(member="alice")
    assert [key for key, _ in sched.pools.history(alice, 4)] == [key for key, _ in sched.pools.history(first, 4)]


def test_an_answer_preempted_between_drafts_resumes_where_its_kept_tokens_end():
    """alice holds both readers with drafting answers; bob's chat takes one of them (a member's share),
    and her preempted answer is read again and goes on: every answer the same tokens as without drafting,
    and the fake model's cache positions always where the scheduler says (`FakeRunner` asserts them)."""
    outputs = {}
    for drafting in (DraftSettings(), ON):
        sched, runner = scheduler(drafting, num_seqs=2, interactive_cells=0), EchoRunner()
        alice = [echo_request(runner, max_tokens=48) for _ in range(2)]
        for r in alice:
            sched.add_request(r)
        now = 0.0
        while not all(len(r.output_tokens) >= 4 for r in alice):
            plan = sched.schedule(now)
            now += 0.02
            sched.update(plan, runner.run(plan), now)
        bob = echo_request(runner, member="bob", max_tokens=8)
        sched.add_request(bob)
        drain(sched, runner, now)
        assert sum(r.num_preemptions for r in alice) >= 1, "bob's chat took none of alice's readers"
        outputs[drafting.enabled] = [list(r.output_tokens) for r in (*alice, bob)]
        assert all(len(o) == n for o, n in zip(outputs[drafting.enabled], (48, 48, 8)))
    assert outputs[True] == outputs[False]


class DraftModelRunner(EchoRunner):
    """A fake model whose answers echo nothing (each token a function of its position), with a fake draft
    model that guesses them right: the runner fills what the scheduler asked of the draft model."""

    def token(self, request_id: str, position: int) -> int:
        return 5000 + (position * 7919) % 1000

    def run(self, plan):
        for pool in (Pool.INTERACTIVE, Pool.MAIN):
            for item in plan.batches[pool]:
                asked = plan.model_drafts.get(item.request_id)
                if asked is not None:
                    guess = [self.token(item.request_id, item.start + 1 + i) for i in range(asked[2])]
                    item.tokens.extend(guess)
                    plan.drafts[item.request_id] = guess
        return super().run(plan)


def test_a_draft_model_guesses_where_the_answer_echoes_nothing():
    steps, outputs = {}, {}
    for model in (False, True):
        sched, runner = scheduler(DraftSettings(enabled=True, max_draft=8, lanes=frozenset({"chat"}), model=model)), \
            DraftModelRunner()
        request = echo_request(runner, max_tokens=40)
        sched.add_request(request)
        plans = drain(sched, runner)
        steps[model], outputs[model] = len(plans), list(request.output_tokens)
        asked = sum(len(p.model_drafts) for p in plans)
        assert (asked > 0) == model, "the draft model is asked only when there is one"
    assert outputs[True] == outputs[False] and len(outputs[True]) == 40
    assert steps[True] * 2 < steps[False], steps
