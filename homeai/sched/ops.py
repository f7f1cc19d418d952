"""The cache operations a plan carries to the runner, applied in order before its step:
`Drop` (a sequence's cells from a position on) and `Copy` (one sequence sharing another's first cells)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Drop:
    """Drop a sequence's cells from position `start` on (0: all of them)."""

    seq_id: int
    start: int = 0


@dataclass(frozen=True)
class Copy:
    """Let sequence `dst` share the first `length` cells of sequence `src` (no tokens recomputed)."""

    src: int
    dst: int
    length: int
