"""`homeai bench neighbour` runs end to end on tiny phases, starts its busy processes and kills them."""

from __future__ import annotations

import json

from homeai.bench import neighbour


def test_the_busy_processes_are_killed(tmp_path):
    loops = neighbour.busy_loops(2, seconds=30)
    neighbour.stop(loops)
    assert all(p.poll() is not None for p in loops)


def test_the_bench_reports_every_phase(make_engine, tmp_path):
    engine = make_engine()
    doc = neighbour.run(engine, phase_s=2.0, num_busy=1, chat_every_s=0.2)
    neighbour.write(doc, "test machine", tmp_path)
    saved = json.loads((tmp_path / "neighbour.json").read_text())
    assert set(saved["phases"]) == {"quiet", "busy", "after"}
    assert saved["phases"]["quiet"]["chats"] > 0 and saved["phases"]["quiet"]["chat_16_tokens_ms_p50"] is not None
    assert sum(m["embedding_tok_s"] for m in saved["phases"].values()) > 0
    assert all(m["homeai_cores"] > 0 and m["threads_at_end"] >= 1 for m in saved["phases"].values())
    assert set(saved["ratios"]) == {"chat_ttft_busy_over_quiet", "chat_16_tokens_busy_over_quiet",
                                    "embeddings_busy_over_quiet"}
    assert "every lane answered again" in (tmp_path / "neighbour.md").read_text()
