"""`homeai bench images` over the shared vision runner (SmolLM2 with a random tiny projector), quick:
both phases run and the report has every figure the issue asks for (none is asserted: speed is the
benchmark's to measure, not a test's)."""

from __future__ import annotations

import dataclasses

from homeai.bench import image_bench
from homeai.config import LimitsConfig

TINY = dataclasses.replace(image_bench.QUICK, phase_s=3.0, ask_every_s=1.0)


def test_quick_run_reports_every_figure(vision_runner, tmp_path):
    from tests.conftest import _engines

    build = _engines(vision_runner)
    engine = next(build)()
    lines = []
    try:
        report = image_bench.run(engine, vision_runner, TINY, LimitsConfig(), progress=lines.append)
    finally:
        engine.stop()
    assert report["image_tokens"] == 16 and report["idle"]["chat_questions"] > 0
    busy = report["beside_images"]
    assert busy["camera_questions"] > 0 and busy["camera_ttft_p50_ms"] > 0 and busy["encode_ms_per_token"] > 0
    assert report["beside_text"]["camera_questions"] > 0
    assert report["chat_ttft_p95_ratio"] > 0 and report["chat_ttft_p95_ratio_text"] > 0 and len(lines) == 3
    text = image_bench.markdown(report, "homeai bench images --quick")
    assert "| beside image questions |" in text and "| beside its text twin |" in text
    assert not engine.scheduler.has_work() and not vision_runner.vision._held
