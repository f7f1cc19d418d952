"""The core watch's change of thread count reaches the scheduler's cost model at once (issue 27):
a neighbour that takes a core slows every step about as much as the threads fell, and the
contention factor believes it in the step it happens, not over the ~10 s the steps would take.
A scripted runner (no model) whose steps slow as its threads fall, as llama.cpp's do.

Run: .venv/bin/python -m pytest -q tests/engine/test_threads_hint.py
"""

from __future__ import annotations

import threading

from homeai.engine.engine import Engine
from homeai.sched.request import SamplingParams
from homeai.sched.scheduler import SchedulerLimits
from lanes import DEFAULT_POLICIES
from tests.engine.test_engine_accounting import ScriptedModel

TIMEOUT = 10.0


class WatchedModel(ScriptedModel):
    """Two threads, then one from step `drop_at` (a neighbour came), then two from `back_at`."""

    def __init__(self, drop_at: int, back_at: int):
        super().__init__()
        self.num_threads, self.drop_at, self.back_at = 2, drop_at, back_at
        self.contention_after: list[float] = []  # read by the test: the model's factor after each step

    def run(self, plan):
        step = len(self.plans)
        self.num_threads = 1 if self.drop_at <= step < self.back_at else 2
        self.step_ms = 10.0 * 2 / self.num_threads
        return super().run(plan)


def answer(engine: Engine, model: WatchedModel, steps: int) -> list[float]:
    """Contention after each step of one long greedy answer."""
    seen: list[float] = []
    record = engine.scheduler.update

    def update(plan, result, now):
        outputs = record(plan, result, now)
        seen.append(engine.scheduler.cost.contention)
        return outputs

    engine.scheduler.update = update
    stream = engine.submit(list(range(10, 20)), lane="summaries", member="alice",
                           params=SamplingParams(max_tokens=steps, ignore_eos=True))
    reader = threading.Thread(target=lambda: list(stream), daemon=True)
    reader.start()
    reader.join(TIMEOUT)
    assert not reader.is_alive(), "the request hung"
    return seen


def test_a_thread_lost_to_a_neighbour_is_believed_in_the_step_it_happens():
    model = WatchedModel(drop_at=30, back_at=45)
    limits = SchedulerLimits(num_cells=4096, num_seqs=8, max_step_tokens=256, embed_max_tokens=512,
                             embed_max_seqs=8)
    engine = Engine(model, dict(DEFAULT_POLICIES), limits).start()
    try:
        seen = answer(engine, model, steps=60)
    finally:
        engine.stop()
    assert seen[28] < 1.1  # two threads, the steps at the fit's pace
    assert 1.8 < seen[30] < 2.2  # the first one-thread step: twice as slow, believed at once
    assert 1.8 < seen[44] < 2.2  # and kept while the steps stay that slow
    assert seen[46] < 1.2  # the thread back: the factor let go
