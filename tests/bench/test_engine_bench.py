"""`homeai bench engine` over the shared model: a row per sequence count, and the engine still
answers right after the raw loop emptied llama.cpp's cache under it."""

from __future__ import annotations

import asyncio

from homeai.bench.engine_bench import _prompts, engine_throughput, planning_cost, report
from homeai.sched.request import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _answer(engine, prompt: list[int]) -> str:
    text, _ = asyncio.run(engine.generate(prompt, lane="summaries", params=GREEDY))
    return text


def test_rows_and_report(make_engine):
    rounds = []
    rows = engine_throughput(make_engine(), [1, 3], 4, rounds=3, between=lambda: rounds.append(len(rounds)))
    assert [r["seqs"] for r in rows] == [1, 3]
    assert len(rounds) == 6, "the planning cost is sampled before every round of every row"
    assert all(r["homeai_tok_s"] > 0 and r["raw_tok_s"] > 0 for r in rows)
    assert all(len(r["ratios"]) == 3 and r["ratio"] == sorted(r["ratios"])[1] for r in rows)  # the median of three
    text = report(rows, planning_cost(num_waiting=16, num_running=8, steps=5))
    assert "| 3 |" in text and "scheduler planning" in text and f"{rows[0]['ratios'][2]:.2f} |" in text
    assert "overhead ms/step" in text and all(r["overhead_ms"] == r["overhead_ms"] for r in rows)  # a number, not NaN
    assert "raw loop ms/step" in text and all(r["raw_step_ms"] > 0 for r in rows)
    assert f"| {rows[1]['raw_step_ms']:.3f} |" in text


def test_the_engine_answers_the_same_after_the_raw_loop(make_engine):
    """The raw loop clears llama.cpp's cache: the engine's cached prefixes must go with it (they were
    read as if still there, and the same greedy question came back as other text)."""
    engine = make_engine()
    prompt = _prompts(engine.runner, 1)[0]
    before = _answer(engine, prompt)
    engine_throughput(engine, [1], 4)
    assert _answer(engine, prompt) == before
