"""One indexing run: read the folders, embed what changed, write it, drop what went, summarise.

Incremental by content hash: an unchanged file is left alone, a changed one replaced, a
file gone from a folder removed with its chunks; a file that cannot be read or holds no
text is recorded as skipped with its reason. A photo, when the model reads images, is
indexed by what the model sees in it ("Photo <name>: <description>", described on the
`indexing` lane; the description is its summary); one that cannot be decoded within
`[limits]` (corrupt, a bomb) is skipped with the reason. Chunks of several documents are
embedded together (`embed_batch` at a time, one request per chunk on the `indexing` lane,
which batches them), and each document is then written in ONE transaction: its row, its hash
and all its chunks (the full-text index follows by trigger). A run killed at any point
leaves every document either fully indexed or as it was, so the next run redoes only
what was not written.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from homeai.config import JobsConfig, LimitsConfig
from homeai.service.background import EngineStopped, InvalidRequest, Work
from homeai.service.images import ImageRefused, decode
from homeai.jobs.chunking import TextChunk, chunk_text
from homeai.jobs.extract import FileData, Skip, extract_text, read_file, walk
from homeai.jobs.runs import Progress
from homeai.jobs.scope import Scope, root_path
from homeai.jobs.summarise import Summariser, summarise_documents
from homeai.store.models import Chunk, Document, utcnow

SPECIAL_TOKENS_ROOM = 8  # BOS/EOS the engine adds to each embedding input
LANE = "indexing"  # a background lane: chunks embedded, photos described
DESCRIPTION_TOKENS = 160  # two or three sentences, with room; one that runs on is cut there


class Stopped(Exception):
    """The run was asked to stop (the server is shutting down)."""


@dataclass
class Report:
    indexed: int = 0
    unchanged: int = 0
    skipped: int = 0
    removed: int = 0
    summarised: int = 0
    chunks: int = 0
    errors: list[dict] = field(default_factory=list)


@dataclass
class _Prepared:
    path: str
    file: FileData
    chunks: list[TextChunk]
    summary: str | None = None  # a photo's description: no summary to ask for


class Indexer:
    def __init__(self, work: Work, sessions: sessionmaker[Session], settings: JobsConfig, *,
                 limits: LimitsConfig = LimitsConfig(), summariser: Summariser | None = None,
                 stop: threading.Event | None = None):
        self.work, self.sessions, self.settings, self.limits = work, sessions, settings, limits
        self.sees = work.sees()
        self.summariser = summariser
        self.stop = stop or threading.Event()
        self.max_tokens = min(settings.chunk_tokens, work.embed_max_tokens - SPECIAL_TOKENS_ROOM)
        self.overlap = min(settings.chunk_overlap, self.max_tokens // 2)

    # ---- the run ---------------------------------------------------------------

    def run(self, roots: list[Path], progress: Progress) -> Report:
        report = Report()
        scanned = [r for r in roots if r.exists() or r.is_symlink()]
        for root in roots:
            if root not in scanned:  # an unmounted disk: report it, and keep what was indexed from it
                progress.error(str(root), "not found (its documents are kept)")
        files = list(dict.fromkeys(p for root in scanned for p in walk(root)))
        # Links resolved once per run; a link may reach any configured folder, not only this run's.
        scope = Scope.of([*scanned, *map(root_path, self.settings.index_paths)])
        known = self._known(scanned)
        progress.set_total(len(files))
        self._index(files, scope, known, report, progress)
        self._remove_missing(known, {str(p) for p in files}, report)
        if self.summariser is not None:
            self._summarise(scanned, report, progress)
        report.errors = list(progress.errors)
        return report

    def _index(self, files: list[Path], scope: Scope, known: dict, report: Report, progress: Progress) -> None:
        batch: list[_Prepared] = []
        for path in files:
            self._check_stop()
            progress.working_on(str(path))
            prepared = self._prepare(path, scope, known.get(str(path)), report, progress)
            if prepared is None:
                progress.advance()
                continue
            batch.append(prepared)
            if sum(len(p.chunks) for p in batch) >= self.settings.embed_batch:
                self._flush(batch, report, progress)
                batch = []
        self._flush(batch, report, progress)

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Stopped("stopped")

    def _known(self, roots: list[Path]) -> dict[str, tuple[str, str, str | None]]:
        """Documents under the roots: path -> (hash, status, skip reason)."""
        with self.sessions() as session:
            rows = session.execute(select(Document.path, Document.content_hash, Document.status,
                                          Document.skip_reason)).all()
        return {p: (h, s, r) for p, h, s, r in rows if _under(Path(p), roots)}

    # ---- one file ----------------------------------------------------------------

    def _prepare(self, path: Path, scope: Scope, known, report: Report, progress: Progress) -> _Prepared | None:
        """The file's chunks when it must be (re)indexed; None when it is unchanged or skipped."""
        file = read_file(path, scope, photos=self.sees)
        if isinstance(file, Skip):
            self._record_skip(path, None, file.reason, known, report)
            return None
        if known is not None and known[0] == file.content_hash and known[1] in ("indexed", "skipped"):
            report.unchanged += 1
            return None
        text, summary = self._text(path, file, progress)
        if isinstance(text, Skip):
            self._record_skip(path, file, text.reason, known, report)
            return None
        if text is None:  # a photo not described this time (reported): the next run tries again
            return None
        try:
            chunks = self._chunks(text)
        except Exception as e:  # a tokenizer failure on one odd file must not end the run
            progress.error(str(path), f"could not be chunked: {e}")
            return None
        return _Prepared(str(path), file, chunks, summary)

    def _text(self, path: Path, file: FileData, progress: Progress) -> tuple[str | Skip | None, str | None]:
        """The text to index and, for a photo, its summary: its description."""
        if not file.photo:
            return extract_text(path, file.data), None
        description = self._describe(path, file.data, progress)
        if not isinstance(description, str):
            return description, None
        return f"Photo {path.name}: {description}", description

    def _describe(self, path: Path, data: bytes, progress: Progress) -> str | Skip | None:
        """What the model sees in the photo; a Skip when it cannot be read; None when the model failed
        (reported)."""
        try:
            picture = decode(data, self.limits)
            return asyncio.run(self.work.describe(picture, lane=LANE, max_tokens=DESCRIPTION_TOKENS))
        except ImageRefused as e:  # corrupt, too large, a decompression bomb
            return Skip(str(e))
        except InvalidRequest as e:  # the engine will not take it (more image tokens than the context holds)
            return Skip(f"a photo the model cannot read: {e}")
        except EngineStopped:
            raise
        except Exception as e:  # this photo is tried again by the next run
            progress.error(str(path), f"could not be described: {e}")
            return None

    def _chunks(self, text: str) -> list[TextChunk]:
        count = lambda s: self.work.count(s, add_special=False, embedding=True)  # noqa: E731
        limit = self.work.embed_max_tokens - SPECIAL_TOKENS_ROOM
        max_tokens = self.max_tokens
        while True:  # pieces are counted apart; the rare chunk whose whole is longer is cut finer
            chunks = chunk_text(text, count, max_tokens, min(self.overlap, max_tokens // 2))
            if all(count(c.text) <= limit for c in chunks) or max_tokens <= 16:
                return chunks
            max_tokens = max_tokens * 3 // 4

    def _record_skip(self, path: Path, file: FileData | None, reason: str, known, report: Report) -> None:
        report.skipped += 1
        content_hash = file.content_hash if file else ""
        if known is not None and known[1] == "skipped" and known[0] == content_hash and known[2] == reason:
            return
        with self.sessions.begin() as session:
            doc = _document(session, str(path))
            doc.content_hash, doc.status, doc.skip_reason = content_hash, "skipped", reason
            doc.size, doc.mtime = (file.size, file.mtime) if file else (0, 0.0)
            doc.summary, doc.indexed_at = None, utcnow()
            session.flush()
            session.execute(delete(Chunk).where(Chunk.document_id == doc.id))

    # ---- a batch of documents --------------------------------------------------

    def _flush(self, batch: list[_Prepared], report: Report, progress: Progress) -> None:
        if not batch:
            return
        texts = [c.text for p in batch for c in p.chunks]
        progress.working_on(f"embedding {len(texts)} chunks of {len(batch)} documents")
        try:
            vectors = self._embed(texts)
        except (Stopped, EngineStopped):
            raise
        except Exception as e:  # this batch is retried by the next run
            for p in batch:
                progress.error(p.path, f"embedding failed: {e}")
                progress.advance()
            return
        at = 0
        for p in batch:
            self._write(p, vectors[at:at + len(p.chunks)])
            at += len(p.chunks)
            report.indexed += 1
            report.chunks += len(p.chunks)
            progress.advance()

    def _embed(self, texts: list[str]) -> list[np.ndarray]:
        vectors, _ = asyncio.run(self.work.embed(texts, lane=LANE))
        if any(v is None for v in vectors):  # aborted: the engine is stopping
            raise Stopped("the engine stopped")
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    def _write(self, p: _Prepared, vectors: list[np.ndarray]) -> None:
        """The document, its hash and all its chunks in one transaction: whole or not at all."""
        with self.sessions.begin() as session:
            doc = _document(session, p.path)
            doc.content_hash, doc.size, doc.mtime = p.file.content_hash, p.file.size, p.file.mtime
            doc.status, doc.skip_reason, doc.summary, doc.indexed_at = "indexed", None, p.summary, utcnow()
            session.flush()
            session.execute(delete(Chunk).where(Chunk.document_id == doc.id))
            session.add_all(Chunk(document_id=doc.id, ordinal=i, text=c.text, start_char=c.start, end_char=c.end,
                                  embedding=v.tobytes()) for i, (c, v) in enumerate(zip(p.chunks, vectors)))

    def _remove_missing(self, known: dict, present: set[str], report: Report) -> None:
        gone = [path for path in known if path not in present]
        for at in range(0, len(gone), 500):  # SQLite caps the parameters of one statement
            with self.sessions.begin() as session:  # chunks and their full-text rows go by cascade
                session.execute(delete(Document).where(Document.path.in_(gone[at:at + 500])))
        report.removed += len(gone)

    # ---- summaries ---------------------------------------------------------------

    def _summarise(self, roots: list[Path], report: Report, progress: Progress) -> None:
        with self.sessions() as session:
            rows = session.execute(select(Document.id, Document.path).where(
                Document.status == "indexed", Document.summary.is_(None)).order_by(Document.id)).all()
        doc_ids = [doc_id for doc_id, path in rows if _under(Path(path), roots)]
        if not doc_ids:
            return
        progress.set_total(progress.total + len(doc_ids))
        max_parallel = self.work.max_batch("summaries")
        report.summarised = asyncio.run(summarise_documents(
            self.summariser, self.sessions, doc_ids, progress, max_parallel=max_parallel,
            should_stop=self.stop.is_set))
        self._check_stop()


def _document(session: Session, path: str) -> Document:
    doc = session.scalar(select(Document).where(Document.path == path))
    if doc is None:
        doc = Document(path=path)
        session.add(doc)
    return doc


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)
