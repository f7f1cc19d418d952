"""Asyncio readers are woken once a step while an interactive answer streams, and at most every
BACKGROUND_WAKE_S while only background answers do (a job reads its answer whole; each wake-up is
a system call and a turn of the event loop). Every token and the finish still arrive. A scripted
runner (no model), its steps instant.

Run: .venv/bin/python -m pytest -q tests/engine/test_reader_wakes.py
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from homeai.engine import engine as engine_mod
from homeai.engine.engine import Engine, TokenEvent
from homeai.sched.request import SamplingParams
from homeai.sched.scheduler import SchedulerLimits
from lanes import DEFAULT_POLICIES
from tests.engine.test_engine_accounting import ScriptedModel

TOKENS = 120


class SlowSteps(ScriptedModel):
    """Each step takes a millisecond of wall time, as a small model's decode would."""

    def run(self, plan):
        import time
        time.sleep(0.001)
        return super().run(plan)


@pytest.fixture
def engine():
    limits = SchedulerLimits(num_cells=4096, num_seqs=8, max_step_tokens=256, embed_max_tokens=512,
                             embed_max_seqs=8)
    running = Engine(SlowSteps(), dict(DEFAULT_POLICIES), limits).start()
    yield running
    running.stop()


def answer_and_wakes(engine: Engine, lane: str, monkeypatch) -> tuple[int, int, int]:
    """(tokens read, steps run, wake-ups) for one greedy answer of TOKENS tokens on `lane`."""
    wakes = []
    real = engine_mod.wake_all
    monkeypatch.setattr(engine_mod, "wake_all", lambda streams: (wakes.append(len(streams)), real(streams)))
    steps = engine.counters["steps"]

    async def read():
        stream = engine.submit(list(range(10, 20)), lane=lane, member="alice",
                               params=SamplingParams(max_tokens=TOKENS, ignore_eos=True))
        tokens = [event async for event in stream if isinstance(event, TokenEvent)]
        assert stream.finished is not None and stream.finished.reason == "length"
        return len(tokens)

    read_tokens = asyncio.run(asyncio.wait_for(read(), 30))
    return read_tokens, engine.counters["steps"] - steps, len(wakes)


def test_a_chat_reader_is_woken_every_step(engine, monkeypatch):
    tokens, steps, wakes = answer_and_wakes(engine, "chat", monkeypatch)
    assert tokens == TOKENS
    assert wakes >= steps - 2


def test_a_background_reader_is_woken_at_most_every_50_ms_and_reads_everything(engine, monkeypatch):
    tokens, steps, wakes = answer_and_wakes(engine, "summaries", monkeypatch)
    assert tokens == TOKENS and steps >= TOKENS
    assert wakes <= steps / 10  # 120 steps of ~1 ms: a wake every 50 ms, and one at the end



def test_a_finish_wakes_its_background_reader_at_once(engine, monkeypatch):
    """A job sends its next request when the last one's answer is whole: a background finish is not
    held back while other work keeps the engine stepping; it is woken before the next step."""
    real = engine_mod.wake_all
    woken_at: list[int] = []  # the step count when each wake-up was made
    monkeypatch.setattr(engine_mod, "wake_all",
                        lambda streams: (woken_at.append(engine.counters["steps"]), real(streams)))
    finished_at: list[int] = []
    engine.on_finish.append(lambda stats: finished_at.append(engine.counters["steps"]))

    async def jobs():
        long = engine.submit(list(range(10, 20)), lane="summaries", member="bob",
                             params=SamplingParams(max_tokens=2000, ignore_eos=True))  # keeps the steps going
        for _ in range(3):  # short background answers, each sent when the one before is whole
            short = engine.submit(list(range(30, 40)), lane="summaries", member="alice",
                                  params=SamplingParams(max_tokens=2, ignore_eos=True))
            assert [event async for event in short][-1].reason == "length"
        long.abort()

    asyncio.run(asyncio.wait_for(jobs(), 30))
    shorts = finished_at[:3]  # the long answer was aborted after them
    assert len(shorts) == 3 and all(step in woken_at for step in shorts), (shorts, woken_at)


class CountingCondition(threading.Condition):
    """A stream's condition that counts the waits that ran out of time instead of being woken."""

    def __init__(self):
        super().__init__()
        self.timeouts = 0

    def wait(self, timeout=None):
        woken = super().wait(timeout)  # False: the time ran out with no notify
        self.timeouts += not woken
        return woken


@pytest.mark.parametrize("lane", ["chat", "summaries"])
def test_a_plain_thread_reader_is_woken_for_every_event(engine, lane):
    """A reader without an event loop sleeps on the stream's condition; the engine queues events
    without its lock and notifies only when a reader sleeps, so a lost wake-up would show as a
    wait running out its second (the steps are a millisecond apart)."""
    stream = engine.submit(list(range(10, 20)), lane=lane, member="alice",
                           params=SamplingParams(max_tokens=400, ignore_eos=True))
    stream._cond = CountingCondition()  # before the reader's first wait
    tokens = [event for event in stream if isinstance(event, TokenEvent)]
    assert len(tokens) == 400 and stream.finished.reason == "length"
    assert stream._cond.timeouts == 0
