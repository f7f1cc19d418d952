"""Indexing a folder with the real model: new, unchanged, changed and deleted files; files skipped with reasons.

Run: .venv/bin/python -m pytest tests/jobs/test_indexing.py
"""

from __future__ import annotations

import os

import pytest
from sqlalchemy import select, text

from homeai.jobs.extract import NO_EYES
from homeai.jobs.service import JobService
from homeai.store.models import Chunk
from tests.jobs.conftest import TOPICS, documents, jobs_config, work_of, write_docs

pytestmark = pytest.mark.model


def chunk_texts(sessions, doc_id: int) -> list[str]:
    with sessions() as session:
        return list(session.scalars(select(Chunk.text).where(Chunk.document_id == doc_id).order_by(Chunk.ordinal)))


def full_text_hits(sessions, word: str) -> int:
    with sessions() as session:
        return session.scalar(text("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH :w"), {"w": word})


def test_only_changed_files_are_reindexed_and_deleted_ones_lose_their_chunks(tmp_path, store, make_engine, runner):
    folder = tmp_path / "docs"
    long_note = " ".join(f"Shopping note {i}: buy {i} apples, {i} pears and bread." for i in range(1, 16))
    write_docs(folder, {**TOPICS, "notes/shopping.md": long_note})
    service = JobService(jobs_config(tmp_path), work_of(make_engine()), store)

    first = service.run_info(service.run("index", paths=[str(folder)]))
    docs = documents(store)
    assert first["status"] == "done" and first["errors"] == []
    assert first["items_done"] == first["items_total"] == len(TOPICS) + 1
    assert set(docs) == {*TOPICS, "shopping.md"}
    assert all(d["status"] == "indexed" and d["chunks"] >= 1 for d in docs.values())
    bread = " ".join(chunk_texts(store, docs["bread.html"]["id"]))
    assert "rye flour" in bread and "secretScriptWord" not in bread and "color" not in bread
    assert "sticker under the hallway shelf" in " ".join(chunk_texts(store, docs["wifi.pdf"]["id"]))
    shopping = chunk_texts(store, docs["shopping.md"]["id"])
    assert len(shopping) > 1 and all(len(runner.tokenize(c, add_special=False, embedding=True)) <= 64 for c in shopping)
    assert any(a.split()[-1] in b for a, b in zip(shopping, shopping[1:])), "neighbouring chunks overlap"

    (folder / "car.txt").write_text(TOPICS["car.txt"] + " This year the MOT moved to 21 March.")
    os.utime(folder / "garden.md")  # touched, same bytes: not re-indexed
    second = service.run_info(service.run("index", paths=[str(folder)]))
    after = documents(store)
    assert second["status"] == "done" and second["items_done"] == len(TOPICS) + 1
    assert {n for n in after if after[n]["indexed_at"] != docs[n]["indexed_at"]} == {"car.txt"}
    assert after["car.txt"]["hash"] != docs["car.txt"]["hash"]
    assert "21 March" in " ".join(chunk_texts(store, after["car.txt"]["id"]))

    assert full_text_hits(store, "biscuit") == 1
    (folder / "vet.txt").unlink()
    service.run("index", paths=[str(folder)])
    final = documents(store)
    assert set(final) == set(after) - {"vet.txt"}
    assert chunk_texts(store, after["vet.txt"]["id"]) == [] and full_text_hits(store, "biscuit") == 0
    assert all(final[n]["indexed_at"] == after[n]["indexed_at"] for n in final)
    with store() as session:
        session.execute(text("INSERT INTO chunks_fts(chunks_fts) VALUES ('integrity-check')"))


def test_binary_and_unreadable_files_are_skipped_with_reasons(tmp_path, store, make_engine):
    # Tests run as root, and root reads a chmod 000 file; these are files nobody can read.
    folder = tmp_path / "docs"
    write_docs(folder, {"notes.txt": "The spare house key is with the neighbours at number 12."})
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4)
    (folder / "scan.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 9 0 R\ntruncated")
    (folder / "gone.md").symlink_to(tmp_path / "nowhere.md")  # a dangling link
    os.mkfifo(folder / "pipe.txt")  # reading it would block forever
    service = JobService(jobs_config(tmp_path), work_of(make_engine()), store)

    run = service.run_info(service.run("index", paths=[str(folder)]))

    docs = documents(store)
    assert run["status"] == "done" and run["items_done"] == run["items_total"] == 5
    assert docs["notes.txt"]["status"] == "indexed"
    reasons = {name: d["reason"] for name, d in docs.items() if d["status"] == "skipped"}
    assert set(reasons) == {"photo.png", "scan.pdf", "gone.md", "pipe.txt"}
    assert reasons["photo.png"] == NO_EYES  # a photo, but this model has no projector (tests/jobs/test_photos.py)
    assert reasons["scan.pdf"].startswith("unreadable PDF")
    assert "broken symbolic link" in reasons["gone.md"]
    assert "not a regular file" in reasons["pipe.txt"]
    assert all(docs[name]["chunks"] == 0 for name in reasons)
