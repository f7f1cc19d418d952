"""`homeai bench spec` over the shared model, quick: both one-talker workloads and the household mix
run with drafting off and on, and the report says what the issue asks for (no figure is asserted:
speed is the benchmark's to measure, not a test's)."""

from __future__ import annotations

import json

from homeai.bench import spec_bench
from homeai.sched.draft import DraftSettings

ON = DraftSettings(enabled=True, max_draft=8, lanes=frozenset({"voice", "chat"}))


def test_quick_run_reports_every_figure(make_engine, runner, tmp_path):
    engine = make_engine(drafting=ON)
    lines = []
    report = spec_bench.run(engine, runner, spec_bench.QUICK, progress=lines.append)
    for key in ("speedup", "background_ratio", "itl_p95_ratio"):
        assert isinstance(report[key], float) and report[key] > 0, (key, report[key])
    assert isinstance(report["greedy_identical"], bool)
    for name in ("tool_call", "summary"):
        assert report[name]["off_tok_s"] > 0 and report[name]["on_tok_s"] > 0 and all(n > 0 for n in report[name]["tokens"])
    assert report["household"]["off"]["background_tok_s"] > 0 and report["household"]["on"]["talker_tokens"] > 0
    assert report["drafting"]["chat/talker"]["drafted"] > 0, "the one talker never drafted"
    spec_bench.write(report, tmp_path, "homeai bench spec --quick")
    written = json.loads((tmp_path / "spec.json").read_text())
    assert {"speedup", "greedy_identical", "background_ratio", "itl_p95_ratio"} <= set(written)
    assert "| one talker, tool call |" in (tmp_path / "spec.md").read_text()
    assert not engine.scheduler.has_work(), "a phase left work behind"
