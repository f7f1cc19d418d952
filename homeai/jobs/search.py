"""Hybrid search over the indexed chunks, and the document context a chat answer can cite.

Two rankings of the chunks, fused by reciprocal rank fusion (score = sum of 1/(60 + rank)):
full-text (SQLite FTS5 with BM25; PostgreSQL `ts_rank`; elsewhere a LIKE scan) and cosine
similarity between the query's embedding and the stored ones (numpy over every vector: a
household has thousands of chunks, not millions). The vectors are loaded once and
reloaded only when the index changed. Without a loaded model, search is full-text only.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session, sessionmaker

from homeai.service.background import InvalidRequest, QueueFull
from homeai.store.models import Chunk, Document

log = logging.getLogger("homeai.jobs")

RRF_K = 60  # the usual constant: ranks far down either list still count, a little
MAX_QUERY_CHARS = 2000
STOPWORDS = frozenset("""a an and are as at be but by do does for from has have how i in is it its me my not of on
or our so that the their there this to was we what when where which who why will with you your au aux avec ce
ces dans de des du elle en est et il je la le les leur mais ne nous on ou par pas pour qu que qui sa se ses son
sur ta te tu un une vous""".split())

CONTEXT_INTRO = ("Some of the household's documents may help with the question. Use them where they are "
                 "relevant and cite each one you use by its number, like [1]. If they do not hold the "
                 "answer, say so.")


@dataclass(frozen=True)
class Hit:
    chunk_id: int
    document_id: int
    path: str
    ordinal: int  # the chunk's place in its document
    score: float  # reciprocal rank fusion score: higher is better
    snippet: str
    text: str

    def as_dict(self) -> dict:
        return {"path": self.path, "score": round(self.score, 6), "snippet": self.snippet,
                "document_id": self.document_id, "chunk": self.ordinal}


def query_terms(query: str) -> list[str]:
    words = list(dict.fromkeys(re.findall(r"\w+", query.lower())))[:32]
    return [w for w in words if w not in STOPWORDS] or words


def fuse(*rankings: list[int]) -> dict[int, float]:
    """Reciprocal rank fusion of ranked id lists."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, chunk_id in enumerate(ranking, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (RRF_K + rank)
    return scores


class Searcher:
    def __init__(self, sessions: sessionmaker[Session], work: Callable[[], object | None], *,
                 lane: str = "embeddings"):
        self.sessions, self.work, self.lane = sessions, work, lane
        self._vectors = _VectorCache()

    async def search(self, query: str, k: int = 5) -> list[Hit]:
        """The k best chunks for `query`, best first."""
        query = query.strip()[:MAX_QUERY_CHARS]
        terms = query_terms(query)
        if not terms:
            return []
        vector = await self._embed(query)
        return await asyncio.to_thread(self._search, terms, vector, k)

    async def document_context(self, query: str, k: int = 5, max_chars: int = 6000) -> tuple[str, list[dict]]:
        """A system message holding the best chunks, numbered, and the citations they stand for;
        ("", []) when nothing matches."""
        parts, citations, used = [CONTEXT_INTRO], [], 0
        for hit in await self.search(query, k):
            if used + len(hit.text) > max_chars and citations:
                break
            n = len(citations) + 1
            parts.append(f"[{n}] {hit.path}\n{hit.text.strip()}")
            citations.append({"n": n, **hit.as_dict()})
            used += len(hit.text)
        return ("\n\n".join(parts), citations) if citations else ("", [])

    async def _embed(self, query: str) -> np.ndarray | None:
        work = self.work()
        if work is None:
            return None
        try:
            vectors, _ = await work.embed([query], lane=self.lane)
        except (InvalidRequest, QueueFull, RuntimeError) as e:  # full-text only, rather than no answer
            log.warning("search without embeddings: %s", e)
            return None
        return None if vectors[0] is None else np.asarray(vectors[0], dtype=np.float32)

    def _search(self, terms: list[str], vector: np.ndarray | None, k: int) -> list[Hit]:
        depth = max(4 * k, 50)
        with self.sessions() as session:
            lexical = _full_text(session, terms, depth)
            semantic = self._vectors.nearest(session, vector, depth) if vector is not None else []
            scores = fuse(lexical, semantic)
            best = sorted(scores, key=lambda i: -scores[i])[:k]
            rows = session.execute(select(Chunk.id, Chunk.document_id, Document.path, Chunk.ordinal, Chunk.text)
                                   .join(Document).where(Chunk.id.in_(best))).all()
        by_id = {r.id: r for r in rows}
        return [Hit(i, by_id[i].document_id, by_id[i].path, by_id[i].ordinal, scores[i],
                    snippet(by_id[i].text, terms), by_id[i].text) for i in best if i in by_id]


def _full_text(session: Session, terms: list[str], limit: int) -> list[int]:
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        match = " OR ".join(f'"{t}"' for t in terms)  # terms are \w+: quoting makes each a plain word
        return list(session.scalars(text("SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH :q "
                                         "ORDER BY bm25(chunks_fts) LIMIT :n"), {"q": match, "n": limit}))
    if dialect == "postgresql":
        return list(session.scalars(text(
            "SELECT id FROM chunks WHERE to_tsvector('simple', text) @@ to_tsquery('simple', :q) "
            "ORDER BY ts_rank(to_tsvector('simple', text), to_tsquery('simple', :q)) DESC LIMIT :n"),
            {"q": " | ".join(terms), "n": limit}))
    rows = session.execute(select(Chunk.id, Chunk.text).where(
        or_(*(func.lower(Chunk.text).contains(t, autoescape=True) for t in terms)))).all()
    counted = sorted(((sum(t in r.text.lower() for t in terms), r.id) for r in rows), reverse=True)
    return [chunk_id for n, chunk_id in counted[:limit] if n]


class _VectorCache:
    """Every chunk vector as one normalised matrix, reloaded when the index has changed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._version = None
        self._ids = np.zeros(0, dtype=np.int64)
        self._matrix = np.zeros((0, 0), dtype=np.float32)

    def nearest(self, session: Session, vector: np.ndarray, limit: int) -> list[int]:
        with self._lock:
            self._refresh(session, vector.shape[0])
            ids, matrix = self._ids, self._matrix
        if not len(ids):
            return []
        scores = matrix @ (vector / (np.linalg.norm(vector) or 1.0))
        top = np.argsort(-scores)[:limit]
        return [int(ids[i]) for i in top]

    def _refresh(self, session: Session, dim: int) -> None:
        # Every write of a document stamps indexed_at, and a removal changes the counts.
        version = (dim, *session.execute(select(func.count(Document.id), func.max(Document.indexed_at))).one(),
                   *session.execute(select(func.count(Chunk.id), func.max(Chunk.id))).one())
        if version == self._version:
            return
        ids, vectors = [], []
        for chunk_id, blob in session.execute(select(Chunk.id, Chunk.embedding).where(Chunk.embedding.is_not(None))):
            v = np.frombuffer(blob, dtype=np.float32)
            if v.shape[0] == dim:  # vectors of another embedding model cannot be compared
                ids.append(chunk_id)
                vectors.append(v)
        matrix = np.vstack(vectors) if vectors else np.zeros((0, dim), dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        self._matrix = matrix / np.where(norms == 0, 1.0, norms)
        self._ids = np.asarray(ids, dtype=np.int64)
        self._version = version


def snippet(chunk: str, terms: list[str], width: int = 240) -> str:
    """About `width` characters of the chunk around the first query term found, on one line."""
    flat = " ".join(chunk.split())
    lower = flat.lower()
    found = [i for t in terms if (i := lower.find(t[:max(4, len(t) - 2)])) >= 0]
    at = min(found) if found else 0
    start = max(at - width // 3, 0)
    if start:
        space = flat.find(" ", start)
        start = space + 1 if 0 <= space < at else start
    end = min(start + width, len(flat))
    if end < len(flat):
        space = flat.rfind(" ", start, end)
        end = space if space > at else end
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")
