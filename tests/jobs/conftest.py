"""Fixtures for the jobs tests: a migrated SQLite store in tmp_path, a jobs config, generated files.

Documents are kept small (a chunk or two each): the CI box embeds a few hundred tokens a second.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from homeai.config import from_dict
from homeai.service.background import Work
from homeai.store.db import make_engine, make_sessionmaker, migrate
from homeai.store.models import Chunk, Document
from tests.conftest import small_config

TOPICS = {
    "garden.md": "# Garden\n\nThe tomatoes on the balcony need watering every morning in July. "
                 "Plant the basil between them; slugs avoid it.",
    "car.txt": "The car's MOT is due on 14 March at the garage on Elm Street. Last year it cost 55 pounds "
               "and the tyres were replaced.",
    "bread.html": "<html><head><title>Sourdough</title><style>p {color: red}</style>"
                  "<script>var secretScriptWord = 1;</script></head><body><h1>Sourdough</h1>"
                  "<p>Feed the sourdough starter with rye flour and water every evening; bake when it doubles.</p>"
                  "</body></html>",
    "boiler.md": "# Boiler\n\nThe boiler pressure should read 1.5 bar. If it drops, open the filling loop "
                 "under the kitchen sink for ten seconds.",
    "vet.txt": "Biscuit the cat has her vaccination booster at the vet on the 3rd of June. "
               "She weighs 4.2 kilograms and eats salmon kibble.",
    "wifi.pdf": "The wifi router password is on a sticker under the hallway shelf. Reboot the router "
                "when the fibre light blinks orange.",
}


def work_of(engine) -> Work:
    """What the service hands the jobs (`service.work()`), over a test's engine and its runner."""
    return Work(engine, engine.runner)


def jobs_config(tmp_path, **jobs):
    """The shared test model's config, a SQLite file and data dir in tmp_path, small chunks, no summaries."""
    model = {k: getattr(small_config().model, k) for k in ("n_ctx", "n_seq_max", "n_batch", "n_threads",
                                                           "embed_n_ctx", "embed_n_seq_max")}
    raw = {"server": {"data_dir": str(tmp_path / "data")},
           "database": {"url": f"sqlite:///{tmp_path / 'data' / 'homeai.db'}"},
           "model": model,
           "jobs": {"chunk_tokens": 64, "chunk_overlap": 8, "embed_batch": 16, "summarise": False, **jobs}}
    return from_dict(raw, "(jobs tests)")


@pytest.fixture
def store(tmp_path):
    """Sessions over a migrated SQLite file in tmp_path (the same URL `jobs_config` names)."""
    url = f"sqlite:///{tmp_path / 'data' / 'homeai.db'}"
    migrate(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


def write_docs(folder, docs: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".pdf"):
            path.write_bytes(minimal_pdf(text))
        else:
            path.write_text(text)


def minimal_pdf(text: str) -> bytes:
    """A one-page PDF showing `text` in Helvetica (enough for pypdf to extract it)."""
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    stream = f"BT /F1 10 Tf 40 700 Td ({escaped}) Tj ET".encode("latin-1")
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def documents(sessions) -> dict[str, dict]:
    """Each document by file name: status, reason, hash, indexed_at, chunk count, summary."""
    with sessions() as session:
        counts = dict(session.execute(select(Chunk.document_id, func.count()).group_by(Chunk.document_id)).all())
        return {d.path.rsplit("/", 1)[-1]: {"status": d.status, "reason": d.skip_reason, "hash": d.content_hash,
                                            "indexed_at": d.indexed_at, "chunks": counts.get(d.id, 0),
                                            "summary": d.summary, "id": d.id}
                for d in session.scalars(select(Document))}
