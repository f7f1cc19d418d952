"""Documents, chunks, job runs and request statistics: rows in, rows out, constraints hold."""

import struct

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from homeai.store import stats
from homeai.store.models import Chunk, Document, JobRun, utcnow


def test_document_with_chunks_and_embeddings_round_trips(new_session):
    vector = struct.pack("<3f", 0.5, -1.0, 2.25)
    with new_session() as s:
        doc = Document(path="/home/docs/a.pdf", content_hash="ab" * 32, size=5_000_000_000, mtime=1717171717.125,
                       status="indexed", indexed_at=utcnow(),
                       chunks=[Chunk(ordinal=i, text=f"c{i}", start_char=i * 10, end_char=i * 10 + 9,
                                     embedding=vector if i else None) for i in range(3)])
        s.add(doc)
        s.commit()
    with new_session() as s:
        loaded = s.scalar(sa.select(Document))
        assert (loaded.size, loaded.mtime, loaded.status) == (5_000_000_000, 1717171717.125, "indexed")
        assert [c.ordinal for c in loaded.chunks] == [0, 1, 2]
        assert loaded.chunks[0].embedding is None
        assert struct.unpack("<3f", loaded.chunks[2].embedding) == (0.5, -1.0, 2.25)


def test_chunk_ordinals_are_unique_per_document(session):
    doc = Document(path="/a", content_hash="h", size=1, mtime=0.0, status="pending")
    doc.chunks = [Chunk(ordinal=0, text="a", start_char=0, end_char=1),
                  Chunk(ordinal=0, text="b", start_char=1, end_char=2)]
    session.add(doc)
    with pytest.raises(IntegrityError):
        session.commit()


def test_document_paths_are_unique(session):
    session.add_all([Document(path="/a", content_hash="h", size=1, mtime=0.0, status="pending"),
                     Document(path="/a", content_hash="i", size=1, mtime=0.0, status="pending")])
    with pytest.raises(IntegrityError):
        session.commit()


def test_statuses_are_checked(session):
    session.add(Document(path="/a", content_hash="h", size=1, mtime=0.0, status="lost"))
    with pytest.raises(IntegrityError):
        session.commit()
    session.rollback()
    session.add(JobRun(job_name="index", status="sleeping"))
    with pytest.raises(IntegrityError):
        session.commit()


def test_job_run_progress_and_errors_persist(new_session):
    with new_session() as s:
        run = JobRun(job_name="index", items_total=3)
        s.add(run)
        s.commit()
        assert (run.status, run.items_done, run.errors) == ("running", 0, [])
        run.items_done = 2
        run.current_item = "/b.txt"
        run.errors.append({"item": "/a.bin", "error": "not text"})
        s.commit()
    with new_session() as s:
        loaded = s.scalar(sa.select(JobRun))
        assert (loaded.items_done, loaded.items_total, loaded.current_item) == (2, 3, "/b.txt")
        assert loaded.errors == [{"item": "/a.bin", "error": "not text"}]
        assert loaded.started_at.tzinfo is not None and loaded.finished_at is None


def test_record_request_stores_every_field(new_session):
    fields = dict(request_id="req-1", lane="chat", member="alice", prompt_tokens=120, output_tokens=40,
                  queue_ms=3.5, ttft_ms=80.0, e2e_ms=900.0, preemptions=1, outcome="done")
    with new_session() as s:
        stats.record_request(s, **fields)
        stats.record_request(s, request_id="req-2", lane="embeddings", member=None, outcome="aborted")
    with new_session() as s:
        rows = stats.recent_requests(s)
        assert [r.request_id for r in rows] == ["req-2", "req-1"]
        assert {k: getattr(rows[1], k) for k in fields} == fields
        assert (rows[0].prompt_tokens, rows[0].preemptions, rows[0].ttft_ms) == (0, 0, None)
        assert rows[0].created_at.tzinfo is not None
        assert [r.request_id for r in stats.recent_requests(s, lane="chat")] == ["req-1"]


def test_record_request_refuses_unknown_fields(session):
    with pytest.raises(TypeError):
        stats.record_request(session, request_id="r", lane="chat", outcome="done", tokens_per_s=3.0)
