"""Cutting a document's text into overlapping chunks that each fit one embedding input.

Chunks are measured in the embedding model's own tokens (a `count_tokens` callable, the
engine's tokenizer), not in characters: a character ratio is wrong for code, French or
tables, and a chunk over the engine's limit would be refused. The text is first cut at
the most natural boundary that gives small enough pieces (paragraphs, then lines, then
sentences, then words, then characters), and the pieces are packed greedily up to
`max_tokens`; each new chunk starts with the last pieces of the previous one, up to
`overlap` tokens. Chunks are exact slices of the text (`text[start:end]`), so their
offsets point back into the document. Pure: no model, no database.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# Each pattern matches the end of a piece (the separator stays with the piece before it).
_BOUNDARIES = [re.compile(r"\n\s*\n\s*"), re.compile(r"\n"), re.compile(r"(?<=[.!?;:。！？])\s+"), re.compile(r"\s+")]


@dataclass(frozen=True)
class TextChunk:
    text: str
    start: int  # offset of the first character in the document
    end: int
    num_tokens: int  # as counted piece by piece (the whole chunk may merge a token or two)


def chunk_text(text: str, count_tokens: Callable[[str], int], max_tokens: int, overlap: int = 0) -> list[TextChunk]:
    """Overlapping chunks of at most `max_tokens` tokens covering the whole text."""
    if max_tokens < 1 or not 0 <= overlap < max_tokens:
        raise ValueError(f"need max_tokens >= 1 and 0 <= overlap < max_tokens, got {max_tokens}, {overlap}")
    pieces = _pieces(text, 0, len(text), count_tokens, max_tokens, 0)
    return [c for c in _pack(text, pieces, max_tokens, overlap) if text[c.start:c.end].strip()]


def _pieces(text: str, start: int, end: int, count: Callable[[str], int], limit: int,
            level: int) -> list[tuple[int, int, int]]:
    """(start, end, tokens) spans covering text[start:end], each of at most `limit` tokens."""
    n = count(text[start:end])
    if n <= limit:
        return [(start, end, n)]
    if level == len(_BOUNDARIES):
        return _split_chars(text, start, end, count, limit, n)
    out = []
    for a, b in _split(text, start, end, _BOUNDARIES[level]):
        out += _pieces(text, a, b, count, limit, level + 1)
    return out


def _split(text: str, start: int, end: int, boundary: re.Pattern) -> list[tuple[int, int]]:
    spans, at = [], start
    for m in boundary.finditer(text, start, end):
        if m.end() > at and m.end() < end:
            spans.append((at, m.end()))
            at = m.end()
    spans.append((at, end))
    return spans


def _split_chars(text: str, start: int, end: int, count, limit: int, n: int) -> list[tuple[int, int, int]]:
    """A piece with no boundary left (a long URL, a base64 blob): halve it until the halves fit."""
    if end - start <= 1:
        return [(start, end, n)]
    mid = (start + end) // 2
    out = []
    for a, b in ((start, mid), (mid, end)):
        m = count(text[a:b])
        out += [(a, b, m)] if m <= limit else _split_chars(text, a, b, count, limit, m)
    return out


def _pack(text: str, pieces: list[tuple[int, int, int]], limit: int, overlap: int) -> list[TextChunk]:
    chunks: list[TextChunk] = []
    current: list[tuple[int, int, int]] = []
    total = 0
    for piece in pieces:
        if current and total + piece[2] > limit:
            chunks.append(_chunk(text, current, total))
            current = _tail(current, overlap, limit - piece[2])
            total = sum(p[2] for p in current)
        current.append(piece)
        total += piece[2]
    if current:
        chunks.append(_chunk(text, current, total))
    return chunks


def _tail(pieces: list[tuple[int, int, int]], overlap: int, room: int) -> list[tuple[int, int, int]]:
    """The last pieces of a chunk worth repeating: at most `overlap` tokens, never the whole chunk."""
    tail, total = [], 0
    for piece in reversed(pieces[1:]):
        if total + piece[2] > min(overlap, room):
            break
        tail.insert(0, piece)
        total += piece[2]
    return tail


def _chunk(text: str, pieces: list[tuple[int, int, int]], total: int) -> TextChunk:
    start, end = pieces[0][0], pieces[-1][1]
    return TextChunk(text[start:end], start, end, total)


def join_chunks(chunks: list[tuple[int, int, str]]) -> str:
    """The document text back from its (start, end, text) chunks, overlaps counted once."""
    parts, at = [], 0
    for start, end, chunk in sorted(chunks):
        if end > at:
            parts.append(chunk[max(at - start, 0):])
            at = end
    return "".join(parts)
