"""Photos in watched folders: described by a model that reads images, indexed by their description and
found by it; skipped with a reason when they cannot be decoded or the model reads no images.

The projector has random weights (`vision_runner`): its descriptions are noise, but real answers to a
real image, so the tests search for a word the model wrote.

Run: .venv/bin/python -m pytest tests/jobs/test_photos.py
"""

from __future__ import annotations

import asyncio
import io
import re

import numpy as np
import pytest
from sqlalchemy import select

from homeai.jobs.extract import NO_EYES
from homeai.jobs.search import STOPWORDS
from homeai.jobs.service import JobService
from homeai.store.models import Chunk
from tests.conftest import _engines
from tests.jobs.conftest import documents, jobs_config, work_of, write_docs

pytestmark = pytest.mark.model
pytest.importorskip("gguf")  # the random projector's writer (tests/conftest.py, `vision_runner`)

NOTE = {"notes.txt": "The spare house key is with the neighbours at number 12."}
PHOTOS = ("beach.png", "garden.png")


@pytest.fixture
def make_vision_engine(vision_runner):
    yield from _engines(vision_runner)


def random_png(seed: int, size=(48, 40)) -> bytes:
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def chunk_text(sessions, doc_id: int) -> str:
    with sessions() as session:
        return " ".join(session.scalars(select(Chunk.text).where(Chunk.document_id == doc_id).order_by(Chunk.ordinal)))


def test_photos_are_described_once_indexed_and_found_by_their_description(tmp_path, store, make_vision_engine):
    folder = tmp_path / "photos"
    write_docs(folder, NOTE)
    for seed, name in enumerate(PHOTOS, start=1):
        (folder / name).write_bytes(random_png(seed))
    (folder / "broken.png").write_bytes(random_png(3)[:80])  # its header, then nothing
    work = work_of(make_vision_engine())
    described = []
    describe = work.describe

    async def counted(picture, **kwargs):
        described.append(picture.digest)
        return await describe(picture, **kwargs)

    work.describe = counted
    service = JobService(jobs_config(tmp_path), work, store)

    first = service.run_info(service.run("index", paths=[str(folder)]))
    docs = documents(store)
    assert first["status"] == "done" and first["errors"] == [] and first["items_done"] == 4
    assert len(described) == 2
    assert docs["notes.txt"]["status"] == "indexed" and docs["notes.txt"]["chunks"] >= 1
    assert docs["broken.png"]["status"] == "skipped" and docs["broken.png"]["reason"] == "a corrupt image"
    assert docs["broken.png"]["chunks"] == 0
    for name in PHOTOS:
        photo = docs[name]
        assert photo["status"] == "indexed" and photo["chunks"] >= 1 and photo["summary"], (name, photo)
        assert chunk_text(store, photo["id"]).startswith(f"Photo {name}: ")

    second = service.run_info(service.run("index", paths=[str(folder)]))
    assert second["status"] == "done" and len(described) == 2, "unchanged photos are not described again"
    assert {n: d["indexed_at"] for n, d in documents(store).items()} == {n: d["indexed_at"] for n, d in docs.items()}

    beach, garden = (set(re.findall(r"[a-z]{4,}", docs[n]["summary"].lower())) - STOPWORDS for n in PHOTOS)
    word = sorted(beach - garden - {"photo", "beach", "garden"} or beach)[0]
    hits = asyncio.run(service.search(word, k=3))
    assert any(h.path.endswith("/beach.png") for h in hits), (word, docs["beach.png"]["summary"], hits)
    if word not in garden:
        assert hits[0].path.endswith("/beach.png"), (word, hits)


def test_photos_are_skipped_when_the_model_reads_no_images(tmp_path, store, make_engine):
    folder = tmp_path / "photos"
    write_docs(folder, {**NOTE, "car.txt": "BMW service booked for Friday at the garage on Elm Street."})
    (folder / "beach.png").write_bytes(random_png(1))
    (folder / "scan.dat").write_bytes(random_png(2))  # a photo by its magic bytes
    (folder / "empty.jpg").write_bytes(b"")  # a photo by its name
    service = JobService(jobs_config(tmp_path), work_of(make_engine()), store)

    run = service.run_info(service.run("index", paths=[str(folder)]))
    docs = documents(store)
    assert run["status"] == "done" and run["errors"] == []
    assert {n: d["reason"] for n, d in docs.items() if d["status"] == "skipped"} == dict.fromkeys(
        ("beach.png", "scan.dat", "empty.jpg"), NO_EYES)
    assert docs["car.txt"]["status"] == docs["notes.txt"]["status"] == "indexed"  # "BM" begins a text, too
