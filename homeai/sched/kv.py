"""KV bookkeeping: which sequence ids are free and how many cells of one cache each holds.

Cells are counted, not placed: llama.cpp places them. A live sequence holds one cell per
computed token; admission reserves cells for a request's whole current length so a chunked
prefill never runs dry halfway, and decoding grows a sequence one cell a step. A cached
sequence (a finished request's prefix, kept for reuse) holds its cells too, but they are
reclaimable: `can_admit` counts them as room, and the pool evicts them before it would
preempt or refuse anyone.
"""

from __future__ import annotations


class KVManager:
    def __init__(self, num_cells: int, num_seqs: int, first_id: int = 0):
        self.num_cells = num_cells
        self.free_seq_ids = list(range(first_id + num_seqs - 1, first_id - 1, -1))
        self.allocated: dict[int, int] = {}  # live sequences: seq id -> cells
        self.cached: dict[int, int] = {}  # cached prefixes: seq id -> cells (reclaimable)
        self.num_used_cells = 0  # the sum of `allocated`, kept as it changes (read every step)
        self.num_cached_cells = 0  # the sum of `cached`

    @property
    def num_free_cells(self) -> int:
        return self.num_cells - self.num_used_cells - self.num_cached_cells

    def can_admit(self, num_cells: int, headroom: int = 0) -> bool:
        """A sequence id and `num_cells` cells (`headroom` more kept), evicting cached prefixes if need be."""
        has_id = bool(self.free_seq_ids) or bool(self.cached)
        return has_id and num_cells + headroom <= self.num_free_cells + self.num_cached_cells

    def admit(self, num_cells: int) -> int:
        """A free sequence id holding `num_cells` (the caller evicted what it had to first)."""
        seq_id = self.free_seq_ids.pop()
        self._set_live(seq_id, num_cells)
        return seq_id

    def ensure(self, seq_id: int, num_cells: int) -> bool:
        """Grow a sequence to hold num_cells; False when the free cells do not cover it."""
        extra = num_cells - self.allocated[seq_id]
        if extra <= 0:
            return True
        if extra > self.num_free_cells:
            return False
        self._set_live(seq_id, num_cells)
        return True

    def release(self, seq_id: int) -> None:
        self._set_live(seq_id, None)
        self.free_seq_ids.append(seq_id)

    def cache(self, seq_id: int, num_cells: int) -> None:
        """A live sequence ends and keeps its first `num_cells` as a cached prefix."""
        self._set_live(seq_id, None)
        self._set_cached(seq_id, num_cells)

    def reuse(self, seq_id: int, num_cells: int) -> None:
        """A cached prefix becomes a live sequence again, holding its first `num_cells`."""
        self._set_cached(seq_id, None)
        self._set_live(seq_id, num_cells)

    def trim(self, seq_id: int, num_cells: int) -> None:
        """A cached prefix keeps only its first `num_cells`."""
        self._set_cached(seq_id, min(self.cached[seq_id], num_cells))

    def evict(self, seq_id: int) -> None:
        self._set_cached(seq_id, None)
        self.free_seq_ids.append(seq_id)

    def _set_live(self, seq_id: int, num_cells: int | None) -> None:
        self.num_used_cells += (num_cells or 0) - self.allocated.pop(seq_id, 0)
        if num_cells is not None:
            self.allocated[seq_id] = num_cells

    def _set_cached(self, seq_id: int, num_cells: int | None) -> None:
        self.num_cached_cells += (num_cells or 0) - self.cached.pop(seq_id, 0)
        if num_cells is not None:
            self.cached[seq_id] = num_cells
