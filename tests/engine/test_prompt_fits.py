"""The engine's refusal of a prompt too long, with a scripted runner (no model): a lane's limit is
the largest cache it may be read in, its answer is capped to the room left in the cache it is
read in, and a refusal says how many tokens fit where.

Run: .venv/bin/python -m pytest -q tests/engine/test_prompt_fits.py
"""

from __future__ import annotations

import pytest

from homeai.engine.engine import Engine, PromptTooLong
from homeai.sched.pools import Pool
from homeai.sched.request import SamplingParams
from homeai.sched.scheduler import SchedulerLimits
from lanes import DEFAULT_POLICIES
from tests.engine.test_engine_accounting import ScriptedModel, finished


@pytest.fixture
def engine():
    limits = SchedulerLimits(num_cells=1000, num_seqs=4, max_step_tokens=256, embed_max_tokens=512,
                             embed_max_seqs=8, interactive_cells=200)
    engine = Engine(ScriptedModel(), dict(DEFAULT_POLICIES), limits).start()
    yield engine
    engine.stop()


def tokens(n: int) -> list[int]:
    return [10 + i % 900 for i in range(n)]


def test_each_lane_reports_the_largest_cache_it_may_be_read_in(engine):
    assert engine.max_seq_len_for("chat") == engine.max_seq_len_for("voice") == 1000
    assert engine.max_seq_len_for("summaries") == engine.max_seq_len == 1000
    assert engine.interactive_max_seq_len == 200


def test_a_chat_too_long_for_its_cache_is_answered_from_the_main_one(engine):
    stream = engine.submit(tokens(300), lane="chat", params=SamplingParams(max_tokens=5))
    assert finished(stream).reason == "length" and len(stream.request.output_tokens) == 5
    assert stream.request.pool is Pool.MAIN
    short = engine.submit(tokens(30), lane="chat", params=SamplingParams(max_tokens=5))
    assert finished(short).reason == "length" and short.request.pool is Pool.INTERACTIVE


def test_an_answer_is_capped_to_the_room_left_in_its_cache(engine):
    long = engine.submit(tokens(990), lane="chat", params=SamplingParams(max_tokens=500))
    assert long.request.pool is Pool.MAIN and long.request.params.max_tokens == 10
    short = engine.submit(tokens(150), lane="chat", params=SamplingParams(max_tokens=5000))  # no cache holds it all
    assert short.request.pool is Pool.INTERACTIVE and short.request.params.max_tokens == 50
    # capped to its own cache's room, it fits the main cache too: it may be admitted to either
    assert short.request.pools == (Pool.INTERACTIVE, Pool.MAIN) and long.request.pools == (Pool.MAIN,)
    assert finished(long).reason == "length" and finished(short).reason == "length"


def test_a_prompt_no_cache_holds_is_refused_saying_how_many_tokens_fit_where(engine):
    with pytest.raises(PromptTooLong) as refused:
        engine.submit(tokens(1000), lane="chat")
    assert str(refused.value).startswith(
        "the prompt has 1000 tokens but at most 199 fit the interactive cache and 999 the main cache")
    assert refused.value.limit == 999 and refused.value.code == "context_length_exceeded"
    with pytest.raises(PromptTooLong, match="the prompt has 1000 tokens but at most 999 fit the context"):
        engine.submit(tokens(1000), lane="summaries")
    assert not engine.scheduler.has_work()
