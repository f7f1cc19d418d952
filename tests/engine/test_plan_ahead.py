"""The engine planning each step while the one before computes (`scheduler.plan_ahead = "on"`), on
the real model: answers as the plain loop gives them, ends found a step late cost nothing a client
sees, no placeholder token reaches llama.cpp, and a step that fails after it was settled ahead
still ends every request it held.

Greedy text is compared for one request at a time only: alone in its steps, a sequence's batches
are the same either way, so its logits are too (llama.cpp is not batch-invariant)."""

from __future__ import annotations

import asyncio

import pytest

from homeai.config import from_dict
from homeai.engine.gpu import plans_ahead
from homeai.sched.request import SamplingParams
from homeai.sched.scheduler import PENDING

pytestmark = pytest.mark.model

QUESTIONS = ["Name three colours.", "What is two plus two?", "Say hello to my cat.",
             "Write one sentence about the sea."]


class Watched:
    """The shared runner; every plan it launches is checked for placeholder tokens, and `collect`
    raises on the calls `fails(n)` picks (n counts from 1), or at `fail_at_decode`."""

    def __init__(self, runner, fails=lambda n: False):
        self._runner, self._fails = runner, fails
        self.num_collects = self.num_rows = 0
        # With a count, the collect of that many-th step of decodes alone from now raises too (however
        # many steps the prompt before took: a member's question is read in plain steps)
        self.fail_at_decode: int | None = None

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def launch(self, plan):
        for item in plan.items:
            assert PENDING not in item.tokens, f"{item.request_id}: a placeholder reached llama.cpp"
            self.num_rows += 1
        return self._runner.launch(plan)

    def collect(self, plan, result):
        self.num_collects += 1
        result = self._runner.collect(plan, result)
        if self.fail_at_decode is not None and plan.items and all(len(i.tokens) == 1 and i.sample for i in plan.items):
            self.fail_at_decode -= 1
            if not self.fail_at_decode:
                self.fail_at_decode = None
                raise RuntimeError("injected fault")
        if self._fails(self.num_collects):
            raise RuntimeError("injected fault")
        return result


def chat(engine, text, **params):
    prompt = engine.runner.apply_chat_template([{"role": "user", "content": text}])
    answer = engine.generate(prompt, lane="chat", params=SamplingParams(temperature=0.0, **params))
    return asyncio.run(asyncio.wait_for(answer, 120))  # a stream never ended fails, not hangs


def test_one_answer_at_a_time_is_the_plain_loops_word_for_word(make_engine, runner):
    plain = make_engine(plan_ahead=False)
    expected = [chat(plain, q, max_tokens=40) for q in QUESTIONS]
    plain.stop()
    watched = Watched(runner)
    ahead = make_engine(plan_ahead=True)
    ahead.runner = watched
    got = [chat(ahead, q, max_tokens=40) for q in QUESTIONS]
    for (text, finish), (want, want_finish) in zip(got, expected):
        assert text == want
        assert (finish.reason, finish.stats.output_tokens) == (want_finish.reason, want_finish.stats.output_tokens)
    assert any(f.reason == "stop" for _, f in expected), "no answer ended on its own: the late end went untested"
    assert watched.num_rows > 0
    assert ahead.counters["planned_ahead"] > 100, "the steps were not planned ahead"
    assert plain.counters["planned_ahead"] == 0


def test_answers_in_one_batch_each_end_as_asked(make_engine, runner):
    watched = Watched(runner)
    engine = make_engine(plan_ahead=True)
    engine.runner = watched
    params = [dict(max_tokens=n, ignore_eos=True) for n in (1, 2, 7, 30)] + [dict(max_tokens=60, stop=["."])]

    async def ask():
        return await asyncio.gather(*[engine.generate(engine.runner.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % 4]}]), lane="chat", params=SamplingParams(temperature=0.0, **p))
            for i, p in enumerate(params)])

    answers = asyncio.run(ask())
    for (text, finish), p in zip(answers[:4], params):
        assert (finish.reason, finish.stats.output_tokens) == ("length", p["max_tokens"])
    text, finish = answers[4]
    assert finish.reason == "stop" and "." not in text and finish.stats.output_tokens < 60
    assert not engine.scheduler.running and not engine.streams


def test_a_step_failing_after_it_was_settled_ahead_ends_its_requests(make_engine, runner):
    failing = set()
    watched = Watched(runner, fails=lambda n: n in failing)
    engine = make_engine(plan_ahead=True)
    engine.runner = watched
    # An answer of one token ended ahead, at its only step: when that step fails it must still hear why.
    failing.add(watched.num_collects + 1)
    text, finish = chat(engine, QUESTIONS[0], max_tokens=1, ignore_eos=True)
    assert (finish.reason, finish.error, text) == ("error", "injected fault", "")
    watched.fail_at_decode = 2  # and one failing mid-answer: at its second step of decodes alone
    text, finish = chat(engine, QUESTIONS[1], max_tokens=20, ignore_eos=True)
    assert (finish.reason, finish.error) == ("error", "injected fault")
    assert 0 < finish.stats.output_tokens < 20
    text, finish = chat(engine, QUESTIONS[2], max_tokens=5, ignore_eos=True)
    assert (finish.reason, finish.stats.output_tokens) == ("length", 5), "the engine stopped serving"
    assert not engine.scheduler.running and not engine.streams


def test_auto_plans_ahead_only_with_gpu_offload():
    cfg = from_dict({"model": {"n_gpu_layers": -1}}).model
    assert plans_ahead("auto", cfg, gpu_backend=True)
    assert not plans_ahead("auto", cfg, gpu_backend=False)
    assert not plans_ahead("auto", from_dict({"model": {"n_gpu_layers": 0}}).model, gpu_backend=True)
    assert plans_ahead("on", cfg, gpu_backend=False) and not plans_ahead("off", cfg, gpu_backend=True)
