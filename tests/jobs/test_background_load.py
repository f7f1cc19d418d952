"""Chat still answers while an indexing run fills the background lanes (embedding, then summarising).

How fast it answers is the benchmark's business; here each chat request must complete.
The run also summarises every document, one of them by map-reduce (a small context forces it).

Run: .venv/bin/python -m pytest tests/jobs/test_background_load.py
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from homeai.api.lanes import lanes_view
from homeai.jobs.indexer import Indexer
from homeai.jobs.runs import Progress, start_run
from homeai.jobs.summarise import COMBINE, PART, Summariser
from homeai.sched.request import SamplingParams
from tests.jobs.conftest import TOPICS, documents, jobs_config, work_of, write_docs

pytestmark = pytest.mark.model

LONG = " ".join(f"Week {i}: the recycling goes out on Tuesday, the compost on Friday, and the glass on the "
                f"last Sunday; the bins are behind the shed gate number {i}." for i in range(1, 9))


class RecordingSummariser(Summariser):
    """Remembers which prompts each document needed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompts: list[tuple[str, str]] = []

    async def _ask(self, template, **fields):
        self.prompts.append((template, fields["title"]))
        return await super()._ask(template, **fields)


def background_busy(engine, lane: str) -> bool:
    state = lanes_view(engine.state())["lanes"][lane]
    return state["queued"] + state["running"] > 0


def wait_until(predicate, timeout: float = 300.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def chat(engine, runner, questions: list[str]) -> list[tuple[str, object]]:
    async def ask(question):
        prompt = runner.apply_chat_template([{"role": "user", "content": question}])
        return await engine.generate(prompt, lane="chat", params=SamplingParams(temperature=0, max_tokens=12))

    async def main():
        return await asyncio.gather(*(ask(q) for q in questions))

    return asyncio.run(main())


def test_chat_completes_while_indexing_saturates_the_background_lanes(tmp_path, store, make_engine, runner):
    folder = tmp_path / "docs"
    docs = {name: TOPICS[name] for name in ("car.txt", "boiler.md")}
    write_docs(folder, {**docs, "bins.md": LONG})
    cfg = jobs_config(tmp_path, embed_batch=2, summarise=True, summary_tokens=16)
    engine = make_engine()
    summariser = RecordingSummariser(work_of(engine), max_tokens=16, context_tokens=256)
    indexer = Indexer(work_of(engine), store, cfg.jobs, summariser=summariser)
    progress = Progress(store, start_run(store, "index"))
    result = {}

    def index() -> None:
        try:
            result["report"] = indexer.run([folder], progress)
        except BaseException as e:
            result["error"] = e

    worker = threading.Thread(target=index)
    worker.start()
    answers, busy = [], set()

    def lane_busy_or_run_over(lane: str) -> bool:
        if background_busy(engine, lane):
            busy.add(lane)
        return lane in busy or not worker.is_alive()

    try:
        for lane in ("indexing", "summaries"):
            wait_until(lambda: lane_busy_or_run_over(lane))
            assert lane in busy, f"the {lane} lane never got work: {result}"
            answers += chat(engine, runner, ["What colour is the sky?", "Name a fruit."])
    finally:
        worker.join(600)

    for text, finish in answers:
        assert finish.reason in ("stop", "length") and text.strip()
    assert "error" not in result, result
    report = result["report"]
    assert report.indexed == report.summarised == len(docs) + 1 and not report.errors
    assert all(d["status"] == "indexed" and d["summary"] for d in documents(store).values())
    bins = [template for template, title in summariser.prompts if title == "bins.md"]
    assert bins.count(PART) >= 2 and COMBINE in bins, "the long document was summarised by map-reduce"
