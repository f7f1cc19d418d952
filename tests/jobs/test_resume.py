"""`homeai index` killed with SIGKILL mid-run, then run again: every document indexed exactly once.

A real subprocess (`python -m homeai.index_cli index`, the command `homeai index` runs),
killed once some documents are written and before all are.

Run: .venv/bin/python -m pytest tests/jobs/test_resume.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from homeai.store.db import make_engine, make_sessionmaker
from homeai.store.models import Chunk, Document, JobRun
from tests.jobs.conftest import documents, jobs_config, write_docs

pytestmark = pytest.mark.model

WORDS = ["amber", "birch", "cobalt", "dune", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
         "lagoon"]
ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path) -> Path:
    cfg = jobs_config(tmp_path, embed_batch=2)  # small batches: documents are written a few at a time
    model = "\n".join(f"{k} = {getattr(cfg.model, k)}" for k in
                      ("n_ctx", "n_seq_max", "n_batch", "n_threads", "embed_n_ctx", "embed_n_seq_max"))
    path = tmp_path / "homeai.toml"
    path.write_text(f'[server]\ndata_dir = "{cfg.data_dir}"\n[database]\nurl = "{cfg.database_url}"\n'
                    f"[model]\n{model}\n[jobs]\nchunk_tokens = 64\nchunk_overlap = 8\nembed_batch = 2\n"
                    "summarise = false\n")
    return path


def index(config: Path, folder: Path, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:  # a file, not a pipe: an unread pipe could stall the child
        return subprocess.Popen([sys.executable, "-m", "homeai.index_cli", "--config", str(config), "index",
                                 str(folder)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def num_indexed(sessions) -> int:
    try:
        with sessions() as session:
            return session.scalar(select(func.count()).where(Document.status == "indexed"))
    except Exception:  # the subprocess has not created the tables yet
        return 0


def test_killed_index_run_resumes_without_redoing_or_duplicating(tmp_path):
    folder = tmp_path / "docs"
    write_docs(folder, {f"{w}.txt": f"The {w} box is on attic shelf {i}, by the {WORDS[i - 1]} crate."
                        for i, w in enumerate(WORDS)})
    config = write_config(tmp_path)
    store = make_engine(jobs_config(tmp_path).database_url)
    sessions = make_sessionmaker(store)

    first = index(config, folder, tmp_path / "first.log")
    deadline = time.monotonic() + 300
    while num_indexed(sessions) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if first.poll() is None:
        os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    before = documents(sessions)
    done_before = {n: d["indexed_at"] for n, d in before.items() if d["status"] == "indexed"}
    assert 2 <= len(done_before) < len(WORDS), "the run was not caught mid-way"

    second = index(config, folder, tmp_path / "second.log")
    assert second.wait(timeout=300) == 0, (tmp_path / "second.log").read_text()

    after = documents(sessions)
    assert set(after) == {f"{w}.txt" for w in WORDS}
    assert all(d["status"] == "indexed" and d["chunks"] == 1 for d in after.values())
    assert {n: after[n]["indexed_at"] for n in done_before} == done_before  # finished documents not redone
    with sessions() as session:
        texts = session.scalars(select(Chunk.text)).all()
        assert len(texts) == len(set(texts)) == len(WORDS)
        for w in WORDS:  # each word is in two notes (its own and the next), and the full-text index says so
            assert session.scalar(text("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH :w"), {"w": w}) == 2
        session.execute(text("INSERT INTO chunks_fts(chunks_fts) VALUES ('integrity-check')"))
        runs = session.scalars(select(JobRun).order_by(JobRun.id)).all()
    assert [r.status for r in runs] == ["interrupted", "done"]
    assert runs[1].items_done == runs[1].items_total == len(WORDS)
    store.dispose()
