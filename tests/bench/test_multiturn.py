"""`homeai bench multiturn`: the report's figures exist and, in simulation (deterministic, no
clock), reuse reads later turns from the cache; members share the stable prompt only when it is
public or by the opt-in; one quick real-model run checks the same shape."""

from __future__ import annotations

import json

from homeai.bench import multiturn
from homeai.cli import main
from homeai.engine.engine import scheduler_limits
from tests.conftest import small_config


def test_simulated_multiturn_reuses_the_stable_prompt(tmp_path, capsys):
    assert main(["bench", "multiturn", "--simulate", "--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "multiturn.json").read_text())
    assert set(doc["scenarios"]) == {"one conversation, idle", "3 members, idle", "3 members, background saturated"}
    for name, scenario in doc["scenarios"].items():
        runs = scenario["policies"]
        assert set(runs) == {"homeai", "homeai-no-reuse", "fifo", "static", "serial"}  # the default
        assert all(r["answered"] == r["turns"] == scenario["shape"]["members"] * 3 for r in runs.values()), name
        assert runs["homeai"]["later_hit_rate"] > 0.8 and runs["homeai-no-reuse"]["hit_rate"] == 0
        assert runs["homeai"]["later_ttft_ms"]["p50"] < runs["homeai-no-reuse"]["later_ttft_ms"]["p50"], name
    markdown = (tmp_path / "multiturn.md").read_text()
    assert "homeai-no-reuse" in markdown and "later / turn 1" in markdown
    assert "report in" in capsys.readouterr().out


def test_members_share_the_stable_prompt_only_when_public_or_opted_in(tmp_path):
    argv = ["bench", "multiturn", "--simulate", "--quick", "--members", "3", "--out", str(tmp_path),
            "--policies", "homeai-shared,homeai,homeai-public"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "multiturn.json").read_text())
    for name, scenario in doc["scenarios"].items():
        runs = scenario["policies"]
        assert all(r["answered"] == r["turns"] for r in runs.values()), name
        if scenario["shape"]["members"] == 1:
            assert runs["homeai"]["hit_rate"] == runs["homeai-shared"]["hit_rate"], "one member: nothing to isolate"
            continue
        # per member, the other members' first turns read the stable prompt themselves
        assert runs["homeai"]["hit_rate"] < runs["homeai-shared"]["hit_rate"], name
        assert runs["homeai"]["turn1_ttft_ms"]["p50"] > runs["homeai-shared"]["turn1_ttft_ms"]["p50"], name
        assert runs["homeai-public"]["hit_rate"] > runs["homeai"]["hit_rate"], name
        assert runs["homeai"]["later_hit_rate"] > 0.8, "each member's own later turns still hit"
    assert any("homeai / homeai-shared" in line for line in doc["findings"])


def test_real_model_multiturn_quick(runner):
    cfg = small_config()
    shape = multiturn.Shape(members=2, turns=2, system_len=120, user_len=10, output_len=4)
    doc = multiturn.run({"quick": shape}, cfg.lanes, scheduler_limits(cfg, runner.info), runner, simulated=False,
                        policies=("homeai", "homeai-no-reuse"))
    runs = doc["scenarios"]["quick"]["policies"]
    assert runs["homeai"]["answered"] == runs["homeai-no-reuse"]["answered"] == 4
    assert runs["homeai"]["later_hit_rate"] > 0.7 and runs["homeai-no-reuse"]["hit_rate"] == 0
