"""`homeai bench members` in its quick shape over the session's model and speech: every phase is
reported with bob's figures, carol's spoken turns (each heard: first audio timed) and the other
member's requests as the daemon answered them (the lanes each member may use decide 200 or 403;
a grammar too large to build is a 400; issue 55's loads are refused or served, never dropped
without an answer, and a guest's trickled body is never served); speeds are the benchmark's to
report, not asserted. And the verdicts against the issues' targets, from figures made up here.

Run: .venv/bin/python -m pytest tests/bench/test_members_bench.py
"""

from __future__ import annotations

import json

import pytest

from homeai.bench import members_bench
from homeai.cli import build_parser
from tests.conftest import small_config

# What the daemon may answer each issue 55 load (the phases' `expect` is None: reported, not judged).
ANSWERS = {"pattern": {"400", "200"}, "slow grammar": {"200", "400", "429"}, "speech": {"200", "429", "503"}}


def test_the_command_line_names_the_benchmark():
    args = build_parser().parse_args(["bench", "members", "--samples", "5", "--out", "x"])
    assert (args.workload, args.samples, args.streams, args.stream_tokens, args.quick) == ("members", 5, 30, 300, False)
    assert (args.carol_turns, args.trickle) == (10, 1000)


@pytest.mark.model
def test_quick_run_reports_every_phase(runner, stt, tts, tmp_path):
    shape = members_bench.QUICK
    report = members_bench.run(small_config(), shape=shape, out=tmp_path, runner=runner, stt=stt, tts=tts,
                               progress=lambda *a, **k: None)
    written = json.loads((tmp_path / "members.json").read_text())
    assert written["bench"] == "members" and written["command"] == "homeai bench members"
    assert list(report["phases"]) == [p.name for p in members_bench.PHASES]
    for phase in members_bench.PHASES:
        figures = report["phases"][phase.name]
        bob = figures["bob"]
        assert bob["n"] == bob["sent"] == bob["whole"] == shape.samples, phase.name
        assert bob["statuses"] == {"200": shape.samples}, phase.name
        assert set(bob["ttft_ms"]) == {"p50", "p95", "max"} and bob["ttft_ms"]["p50"] is not None, phase.name
        assert figures["p50_over_idle"] is not None and figures["result"] in ("pass", "fail", "-"), phase.name
        carol = figures["carol"]
        assert carol["n"] == carol["heard"] == shape.carol_turns, (phase.name, carol)
        assert carol["first_audio_ms"]["p50"] > 0 and figures["carol_p95_over_idle"] is not None, phase.name
        flood = figures["flood"]
        if phase.flooder is None:
            assert flood is None
            continue
        assert flood["member"] == phase.flooder and flood["requests"] >= flood["senders"] > 0, phase.name
        assert flood["transport_errors"] == 0, (phase.name, flood)
        if phase.load == "trickle":  # the guest's bodies: answered (401, 408...) or closed, never served
            assert "200" not in flood["statuses"], flood
            continue
        if phase.expect is None:
            assert set(flood["statuses"]) <= ANSWERS[phase.load], (phase.name, flood)
            continue
        # What the daemon answered this member on this lane: served, or refused naming why.
        assert flood["statuses"] == {str(phase.expect): flood["requests"]}, (phase.name, flood)
        if phase.expect == 200:
            assert flood["tokens_per_s"] > 0 and flood["errors"] == []
        else:
            assert flood["errors"], phase.name
    assert "'voice'" in report["phases"]["voice refused"]["flood"]["errors"][0]
    grammar = report["phases"]["refused grammar"]["flood"]["errors"]
    assert any("response_format.json_schema.schema" in error for error in grammar), grammar
    assert len(report["findings"]) == len(members_bench.PHASES)
    markdown = (tmp_path / "members.md").read_text()
    assert "| phase | the other member |" in markdown and all(p.name in markdown for p in members_bench.PHASES)
    assert "first audio p50 / p95 (ms)" in markdown


def _bob(p50, p95, answered=20):
    return {"n": 20, "answered": answered, "ttft_ms": {"p50": p50, "p95": p95, "max": p95}}


def _carol(p95, heard=10):
    return {"n": 10, "heard": heard, "first_audio_ms": {"p50": p95, "p95": p95, "max": p95}}


def test_a_flood_passes_only_under_one_second_and_three_times_idle():
    flood = next(p for p in members_bench.PHASES if p.name == "chat flood")
    idle = _bob(60.0, 200.0)
    assert members_bench.verdict(flood, _bob(300.0, 590.0), idle, None)[1] == "pass"
    assert members_bench.verdict(flood, _bob(300.0, 610.0), idle, None)[1] == "fail"  # 3.05x idle
    assert members_bench.verdict(flood, _bob(300.0, 1100.0), _bob(60.0, 500.0), None)[1] == "fail"  # over 1 s
    assert members_bench.verdict(flood, _bob(300.0, 590.0, answered=19), idle, None)[1] == "fail"  # one unanswered
    assert members_bench.verdict(flood, _bob(None, None, answered=0), idle, None)[1] == "no figure"


def test_refused_requests_pass_only_when_all_refused_and_bob_unchanged():
    refused = next(p for p in members_bench.PHASES if p.expect == 403)
    idle = _bob(60.0, 100.0)
    all_403 = {"requests": 40, "statuses": {"403": 40}}
    assert members_bench.verdict(refused, _bob(70.0, 140.0), idle, all_403)[1] == "pass"
    assert members_bench.verdict(refused, _bob(70.0, 160.0), idle, all_403)[1] == "fail"  # p95 1.6x idle
    one_served = {"requests": 40, "statuses": {"403": 39, "200": 1}}
    assert members_bench.verdict(refused, _bob(70.0, 140.0), idle, one_served)[1] == "fail"


def test_carols_first_audio_is_judged_beside_bobs_ttft():
    nested = next(p for p in members_bench.PHASES if p.name == "nested pattern")
    idle, bob = _bob(60.0, 200.0), _bob(300.0, 590.0)
    assert members_bench.verdict(nested, bob, idle, None)[1] == "pass"  # no speech: bob alone
    assert members_bench.verdict(nested, bob, idle, None, _carol(900.0), _carol(400.0))[1] == "pass"
    assert members_bench.verdict(nested, bob, idle, None, _carol(1100.0), _carol(400.0))[1] == "fail"  # over 1 s
    assert members_bench.verdict(nested, bob, idle, None, _carol(900.0), _carol(250.0))[1] == "fail"  # 3.6x idle
    assert members_bench.verdict(nested, bob, idle, None, _carol(900.0, heard=9), _carol(400.0))[1] == "fail"
    assert members_bench.verdict(nested, _bob(300.0, 1100.0), idle, None, _carol(900.0), _carol(400.0))[1] == "fail"
    assert members_bench.verdict(nested, bob, idle, None, _carol(None, heard=0), _carol(400.0))[1] == "no figure"
