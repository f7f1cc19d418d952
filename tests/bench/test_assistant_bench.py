"""`homeai bench assistant` in its quick shape over the session's model and a speech model: the
report's fields exist and every turn was answered (speed is the benchmark's to report, not asserted).

Run: .venv/bin/python -m pytest tests/bench/test_assistant_bench.py
"""

from __future__ import annotations

import json

import pytest

from homeai.bench import assistant_bench
from homeai.cli import build_parser
from tests.conftest import small_config

pytestmark = pytest.mark.model


def test_the_command_line_names_the_benchmark():
    args = build_parser().parse_args(["bench", "assistant", "--turns", "2", "--out", "x"])
    assert (args.workload, args.turns, args.conversations, args.devices) == ("assistant", 2, 3, 40)


def test_quick_run_reports_every_figure(runner, stt, tmp_path):
    """Home Assistant asks no length: the voice lane's answers are capped (as a household may set it), so
    the run's time is its figures', not the sampled answers' lengths."""
    shape = assistant_bench.QUICK
    cfg = small_config(lanes={"voice": {"max_tokens": 24}})
    report = assistant_bench.run(cfg, shape=shape, out=tmp_path, runner=runner, stt=stt, progress=lambda *a, **k: None)
    written = json.loads((tmp_path / "assistant.json").read_text())
    assert written["bench"] == "assistant" and written["command"] == "homeai bench assistant"
    assert report["speech"] == "espeak-ng" and report["system_prompt_tokens"] > 0
    for phase in ("idle", "saturated"):
        for group, n in (("turn1", shape.conversations), ("later", shape.conversations * (shape.turns - 1))):
            figures = report["phases"][phase][group]
            assert figures["n"] == n and figures["stt_ms"]["p50"] is not None, (phase, group)
            for key in ("transcript_to_first_ms", "stop_to_first_ms"):
                assert set(figures[key]) == {"p50", "p95"}, (phase, group, key)
            assert figures["cached_share"] is not None and "p50" in figures["text_stop_to_first_ms"]
            assert "p50" in figures["call_stop_to_first_ms"]
    assert all(s["transcript"] for s in report["samples"])
    assert report["background"]["seconds"] > 0
    overhead = report["overhead"]
    assert overhead["reps"] == shape.overhead_reps
    assert all(overhead[k] is not None for k in ("median_difference_ms", "mean_difference_ms", "mean_difference_ci95_ms"))
    assert len(report["findings"]) == 3
    markdown = (tmp_path / "assistant.md").read_text()
    assert "audio-stop -> first line" in markdown and "/api/chat" in markdown


def _report_with(idle: dict, saturated: dict) -> dict:
    def later(p50, calls, text, call):
        return {"later": {"stop_to_first_ms": {"p50": p50}, "tool_calls": calls,
                          "text_stop_to_first_ms": {"p50": text}, "call_stop_to_first_ms": {"p50": call}}}
    overhead = {"median_difference_ms": 0.1, "mean_difference_ci95_ms": 0.5}
    return {"speech": "espeak-ng", "overhead": overhead,
            "phases": {"idle": later(**idle), "saturated": later(**saturated)}}


def test_phases_that_drew_different_mixes_are_compared_kind_by_kind():
    """Words or a call is the model's sampled choice: an idle phase of calls against a saturated
    one of words compares text with text and calls with calls, not one mix with another."""
    mixed = assistant_bench.findings(_report_with(dict(p50=1400, calls=4, text=800, call=1400),
                                                  dict(p50=1100, calls=0, text=1900, call=None)))[1]
    assert "0.79x idle; text answers 2.38x" in mixed and "missed, compared kind by kind" in mixed
    same = assistant_bench.findings(_report_with(dict(p50=800, calls=2, text=800, call=1400),
                                                 dict(p50=1500, calls=2, text=1200, call=3100)))[1]
    assert "1.88x idle; text answers 1.5x, tool calls 2.21x (target <= 2x: met)" in same
