"""A full house: every sequence id taken while requests wait. Placing is skipped when every waiting
request would be refused (`Admission.all_refused`), and the plans are those that placing them
one by one gives."""

from __future__ import annotations

import random

import pytest

from homeai.sched.request import Kind, Request, SamplingParams
from homeai.sched.scheduler import QueueFull
from tests.sched.helpers import FakeRunner, create_request, create_scheduler


def _plan_text(plan) -> str:
    items = [(pool.value, i.request_id, i.seq_id, i.start, len(i.tokens), i.sample)
             for pool, batch in plan.batches.items() for i in batch]
    return repr((plan.budget, tuple(plan.shape), items, plan.cache_ops, plan.done, plan.background))


def _run(seed: int, skip: bool, **limits) -> tuple[list[str], int]:
    """A random full house's plans and outputs; and how many steps skipped placing."""
    rng = random.Random(seed)
    sched, runner = create_scheduler(**limits), FakeRunner()
    refused = sched.admission.all_refused
    skipped = 0

    def counted() -> bool:
        nonlocal skipped
        answer = refused() if skip else False
        skipped += answer
        return answer

    sched.admission.all_refused = counted
    texts, now, made = [], 0.0, 0
    for _ in range(250):
        for _ in range(rng.choice([0, 0, 0, 1, 3])):
            prompt = [rng.randint(10, 900) for _ in range(rng.choice([4, 30, 90]))]
            made += 1
            lane = rng.choice(["voice", "chat", "summaries", "summaries", "embeddings"])
            request = Request(f"q{made}", lane, rng.choice(["alice", "bob", "carol"]), prompt, now,
                              kind=Kind.EMBED if lane == "embeddings" else Kind.GENERATE,
                              params=SamplingParams(max_tokens=rng.choice([20, 60, 200])))
            try:
                sched.add_request(request)
            except QueueFull:
                pass  # a full house indeed
        plan = sched.schedule(now)
        texts.append(_plan_text(plan))
        if not plan.idle:
            outputs = sched.update(plan, runner.run(plan), now)
            texts.append(repr([(o.request.request_id, o.sample, o.finished) for o in outputs]))
        now += 0.02
    return texts, skipped


@pytest.mark.parametrize("interactive_cells", [0, 600])
@pytest.mark.parametrize("prompt_cache", [False, True])
def test_a_full_house_plans_as_if_every_waiting_pair_were_tried(interactive_cells, prompt_cache):
    limits = dict(num_cells=3000, num_seqs=4, max_step_tokens=128, interactive_cells=interactive_cells,
                  prompt_cache=prompt_cache)
    for seed in range(3):
        skipping, skipped = _run(seed, True, **limits)
        assert skipped > 20, "the full house was reached, and placing skipped"
        assert skipping == _run(seed, False, **limits)[0]


def test_a_free_sequence_id_or_a_background_sequence_to_give_way_means_placing():
    sched, runner = create_scheduler(num_seqs=2, max_step_tokens=256), FakeRunner()
    running = [create_request(lane="summaries", num_prompt=8, max_tokens=500) for _ in range(2)]
    for request in running:
        sched.add_request(request)
    for _ in range(30):  # past the batching window: both decoding
        plan = sched.schedule(1.0)
        sched.update(plan, runner.run(plan), 1.0)
    sched.add_request(create_request(lane="summaries", member="bob", num_prompt=8, arrival=1.0))
    assert sched.admission.all_refused(), "no id free, and background gives none up for background"
    chat = create_request(lane="chat", member="bob", num_prompt=8, arrival=1.0)
    sched.add_request(chat)
    assert not sched.admission.all_refused(), "a chat may take background's sequence (over its floor)"
    sched.abort(chat.request_id, now=1.0)
    assert sched.admission.all_refused()
    sched.abort(running[0].request_id, now=1.0)
    assert not sched.admission.all_refused(), "a sequence id is free"
