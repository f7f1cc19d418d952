"""Summaries through the summaries lane, map-reduce when a document is longer than the context.

A document that fits `context_tokens` (the model's context less room for the answer) is
summarised in one request. A longer one is cut into pieces that fit (the chunker, in the
generation model's tokens), each piece is summarised ("map", all at once, so the lane
batches them), and the partial summaries are combined ("reduce"), in groups again if even
they do not fit. The long prompts go through chunked prefill like any other request.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from homeai.jobs.chunking import chunk_text, join_chunks
from homeai.service.background import ChatPrompt, EngineStopped, SamplingParams, Work
from homeai.store.models import Chunk, Document
from lanes.base import ServerText

log = logging.getLogger("homeai.jobs")

SYSTEM = ServerText("You summarise a household's documents. Write a short, factual summary in the language "
                    "of the document: what it is, and the facts, dates and amounts that matter. No preamble.")
WHOLE = "Summarise the document {title}.\n\n{text}"
PART = "Summarise part {part} of {parts} of the document {title}.\n\n{text}"
COMBINE = "These are summaries of consecutive parts of the document {title}. Combine them into one summary.\n\n{text}"
MAX_DEPTH = 8  # reduce rounds; each round at least halves the partial summaries


class Summariser:
    def __init__(self, work: Work, *, max_tokens: int, context_tokens: int | None = None, lane: str = "summaries"):
        self.work, self.lane = work, lane
        context = min(context_tokens or work.max_seq_len, work.max_seq_len)
        self.answer_tokens = min(max_tokens, context // 4)
        overhead = self.work.count(self._prompt(COMBINE, title="x" * 40, text="")) + 16
        self.text_budget = max(context - self.answer_tokens - overhead, 32)
        self.params = SamplingParams(temperature=0.0, max_tokens=self.answer_tokens)

    def count(self, text: str) -> int:
        return self.work.count(text, add_special=False)

    def _prompt(self, template: str, **fields) -> ChatPrompt:
        """The document's text, its name and partial summaries are text: a document cannot write a turn."""
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": template.format(**fields)}]
        return self.work.chat_prompt(messages)

    async def _ask(self, template: str, **fields) -> str:
        text, finish = await self.work.generate(self._prompt(template, **fields), lane=self.lane, params=self.params)
        if finish is None or finish.reason not in ("stop", "length"):
            raise RuntimeError(f"summary request ended with {finish.reason if finish else 'nothing'}"
                               f"{': ' + finish.error if finish and finish.error else ''}")
        return text.strip()

    async def summarise(self, text: str, title: str) -> str:
        if self.count(text) <= self.text_budget:
            return await self._ask(WHOLE, title=title, text=text)
        parts = chunk_text(text, self.count, self.text_budget)
        partials = await asyncio.gather(*(self._ask(PART, part=i + 1, parts=len(parts), title=title, text=p.text)
                                          for i, p in enumerate(parts)))
        return await self._combine(list(partials), title)

    async def _combine(self, partials: list[str], title: str) -> str:
        for _ in range(MAX_DEPTH):
            joined = "\n\n".join(partials)
            if self.count(joined) <= self.text_budget:
                return await self._ask(COMBINE, title=title, text=joined)
            groups = chunk_text(joined, self.count, self.text_budget)
            partials = list(await asyncio.gather(*(self._ask(COMBINE, title=title, text=g.text) for g in groups)))
        return "\n\n".join(partials)


async def summarise_documents(summariser: Summariser, sessions: sessionmaker[Session], doc_ids: list[int],
                              progress, *, max_parallel: int, should_stop) -> int:
    """Summarise the documents (several at once, so the lane batches), each written when done;
    how many were summarised."""
    gate = asyncio.Semaphore(max_parallel)

    async def one(doc_id: int) -> bool:
        async with gate:
            if should_stop():
                return False
            path, content_hash, text = _document_text(sessions, doc_id)
            if text is None:
                return False
            progress.working_on(f"summarising {path}")
            try:
                summary = await summariser.summarise(text, title=path.rsplit("/", 1)[-1])
            except EngineStopped:
                raise
            except Exception as e:
                if should_stop():
                    return False
                log.warning("summary of %s failed: %s", path, e)
                progress.error(path, f"summary failed: {e}")
                progress.advance()
                return False
            _write_summary(sessions, doc_id, content_hash, summary)
            progress.advance()
            return True

    return sum(await asyncio.gather(*(one(doc_id) for doc_id in doc_ids)))


def _document_text(sessions: sessionmaker[Session], doc_id: int) -> tuple[str, str, str | None]:
    with sessions() as session:
        doc = session.get(Document, doc_id)
        if doc is None:
            return "", "", None
        rows = session.execute(select(Chunk.start_char, Chunk.end_char, Chunk.text)
                               .where(Chunk.document_id == doc_id)).all()
        return doc.path, doc.content_hash, join_chunks([tuple(r) for r in rows])


def _write_summary(sessions: sessionmaker[Session], doc_id: int, content_hash: str, summary: str) -> None:
    # Only onto the text that was summarised: a document re-indexed meanwhile waits for its own summary.
    with sessions.begin() as session:
        session.execute(update(Document).where(Document.id == doc_id, Document.content_hash == content_hash)
                        .values(summary=summary))
