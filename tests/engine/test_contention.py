"""After a contention episode poisoned the step-cost fit, the real engine still answers every lane."""

from __future__ import annotations

import asyncio

from homeai.sched.costmodel import StepShape


def test_embeddings_are_answered_after_a_contention_episode_poisoned_the_fit(make_engine):
    engine = make_engine()
    with engine.lock:  # what a compile beside homeai taught the fit: every step a minute long
        for _ in range(40):
            engine.scheduler.cost.observe(StepShape(1, 1, 0.0, 1), 60_000.0)
            engine.scheduler.cost.observe(StepShape(1, 64, 0.0, 1), 90_000.0)
        assert engine.scheduler.cost.predict_ms(StepShape(1, 16, 0.0, 0)) > 10_000
    texts = [f"note {i}: the boiler was serviced in March" for i in range(8)]
    # Not a speed assertion: before the way back these waited forever on an idle box.
    vectors, _ = asyncio.run(asyncio.wait_for(engine.embed(texts), timeout=60))
    assert len(vectors) == 8
    text, finish = asyncio.run(asyncio.wait_for(engine.generate("Hello", lane="chat"), timeout=60))
    assert finish.reason in ("stop", "length")
