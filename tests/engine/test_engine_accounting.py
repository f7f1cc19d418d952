"""The engine's failed step, with a scripted runner (no model): the step's requests end with an
error and the scheduler settles none of it, so the member is not charged for a prompt that was
never read, and the engine serves the next request.

Run: .venv/bin/python -m pytest -q tests/engine/test_engine_accounting.py
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from homeai.engine.engine import Engine
from homeai.sched.request import SamplingParams
from homeai.sched.scheduler import SchedulerLimits
from lanes import DEFAULT_POLICIES
from tests.sched.helpers import FakeRunner

TIMEOUT = 10.0


class ScriptedModel(FakeRunner):
    """The scheduler tests' fake runner, with what the engine asks of a model; `fail` raises in `run`."""

    info = SimpleNamespace(max_seq_len=4096, interactive_max_seq_len=4096, embed_max_tokens=512, n_vocab=1000)

    def __init__(self):
        super().__init__()
        self.fail = False

    def reset(self) -> None:
        self.positions.clear()

    def piece(self, token: int) -> bytes:
        return b"x"

    def run(self, plan):
        if self.fail:
            self.fail = False
            raise RuntimeError("injected fault")
        return super().run(plan)


def finished(stream):
    box = []
    reader = threading.Thread(target=lambda: box.extend(stream), daemon=True)
    reader.start()
    reader.join(TIMEOUT)
    assert not reader.is_alive(), "the request hung"
    return stream.finished


def test_a_failed_step_ends_its_requests_and_charges_their_member_nothing():
    model = ScriptedModel()
    limits = SchedulerLimits(num_cells=4096, num_seqs=8, max_step_tokens=256, embed_max_tokens=512,
                             embed_max_seqs=8)
    engine = Engine(model, dict(DEFAULT_POLICIES), limits).start()
    try:
        model.fail = True
        failed = engine.submit(list(range(10, 50)), lane="chat", member="alice",
                               params=SamplingParams(max_tokens=4))
        finish = finished(failed)
        assert finish.reason == "error" and "injected fault" in finish.error
        assert engine.scheduler.fair.counter(("chat", "alice")) == 0.0, "charged for a step that failed"
        served = finished(engine.submit(list(range(10, 50)), lane="chat", member="alice",
                                        params=SamplingParams(max_tokens=4)))
        assert served.reason == "length"
        weight = DEFAULT_POLICIES["chat"].weight
        fair = engine.scheduler.fair
        assert fair.counter(("chat", "alice")) == (40 * fair.w_in + 4 * fair.w_out) / weight
    finally:
        engine.stop()
