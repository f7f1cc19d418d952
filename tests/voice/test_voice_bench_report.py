"""`homeai bench voice`'s report from hand-made samples (no model): first audio p50/p95 per
phase, the targets' verdicts, background throughput spoken against in words, the synthesis
real-time factor, and a report without a voice (no spoken phases, saying why).

Run: .venv/bin/python -m pytest tests/voice/test_voice_bench_report.py
"""

from __future__ import annotations

import json

from homeai.bench.voice_bench import Sample, _report, _write
from homeai.config import from_dict


def samples(first_token: list[float], first_audio: list[float] | None = None) -> list[Sample]:
    audio = first_audio or [None] * len(first_token)
    return [Sample("q", t, 300.0, t, 2 * t, "q", first_audio_ms=a, server_first_audio_ms=a and a - 5, audio_s=2.0)
            for t, a in zip(first_token, audio)]


def background(tok_s: float) -> dict:
    return {"requests_finished": 3, "tokens_finished": 900, "tok_s": tok_s, "seconds": 20.0,
            "summaries_in_flight": 3, "embed_batch": 16}


def test_the_report_says_first_audio_throughput_and_real_time_factor(tmp_path):
    phases = {"idle": samples([600, 700, 800]), "idle, spoken": samples([600, 700, 800], [900, 1000, 1400]),
              "loaded": samples([800, 900, 1000]), "loaded, spoken": samples([800, 900, 1000], [1500, 1900, 2600])}
    rtf = {"idle": {"rtf": 0.07, "audio_s": 12.0, "synthesis_s": 0.84}, "loaded": {"rtf": 0.2, "audio_s": 12.0,
                                                                                    "synthesis_s": 2.4}}
    report = _report(from_dict({}), phases, {"loaded": background(90.0), "loaded, spoken": background(81.0)}, rtf,
                     None)
    assert report["phases"]["idle, spoken"]["first_audio_ms"]["p50"] == 1000
    assert report["phases"]["loaded, spoken"]["first_audio_ms"]["p50"] == 1900
    findings = "\n".join(report["findings"])
    assert "first audio p50 1000 ms" in findings and "target p50 <= 1500 ms: met" in findings
    assert "first audio p50 1900 ms" in findings and "target p50 <= 2x idle's: met" in findings
    assert "0.9x (target >= 0.8x: met)" in findings
    assert "real-time factor 0.07 idle, 0.2 with the background saturated" in findings
    _write(report, tmp_path)
    assert json.loads((tmp_path / "voice.json").read_text())["synthesis"]["idle"]["rtf"] == 0.07
    text = (tmp_path / "voice.md").read_text()
    assert "| idle, spoken | 3/3 | 700 ms | " in text and "| 1000 ms |" in text


def test_a_box_without_a_voice_reports_the_words_and_why(tmp_path):
    phases = {"idle": samples([600, 700]), "loaded": samples([3500, 4000])}
    report = _report(from_dict({}), phases, {"loaded": background(90.0)}, {}, "text to speech is unavailable: no piper")
    findings = "\n".join(report["findings"])
    assert "target p50 <= 3000 ms: missed" in findings and "no spoken phases: text to speech is unavailable" in findings
    _write(report, tmp_path)
    assert "spoken" not in (tmp_path / "voice.md").read_text().split("| phase |")[1].split("Background")[0]
