"""KV bookkeeping: which sequence ids are free and how many cells of one cache each holds.

Cells are counted, not placed: llama.cpp places them. A live sequence holds one cell per
computed token; admission reserves cells for a request's whole current length so a chunked
prefill never runs dry halfway, and decoding grows a sequence one cell a step. A cached
sequence (a finished request's prefix, kept for reuse) holds its cells too, but they are
reclaimable: `can_admit` counts them as room, and the pool evicts them before it would
preempt or refuse anyone.

A sequence may borrow its first cells from another (`llama_memory_seq_cp` in a unified cache
marks the same cells with both ids): those are counted once, against the lender, and the
borrower counts only the rest. When the lender lets cells go that a borrower still holds
(evicted, released or trimmed), the borrower is counted for them from then on. A cell several
borrowers still share after its lender left is counted for each: the count may exceed what
llama.cpp holds, never fall short of it.
"""

from __future__ import annotations


class KVManager:
    def __init__(self, num_cells: int, num_seqs: int, first_id: int = 0):
        self.num_cells = num_cells
        self.free_seq_ids = list(range(first_id + num_seqs - 1, first_id - 1, -1))
        self.allocated: dict[int, int] = {}  # live sequences: seq id -> cells counted against it
        self.cached: dict[int, int] = {}  # cached prefixes: seq id -> cells counted (reclaimable)
        self.borrowed: dict[int, tuple[int, int]] = {}  # seq id -> (lender, its first cells borrowed)
        self.num_used_cells = 0  # the sum of `allocated`, kept as it changes (read every step)
        self.num_cached_cells = 0  # the sum of `cached`

    @property
    def num_free_cells(self) -> int:
        return self.num_cells - self.num_used_cells - self.num_cached_cells

    def length(self, seq_id: int) -> int:
        """The cells a sequence holds, borrowed ones included (asked of every decoding sequence each step)."""
        own = self.allocated.get(seq_id)
        if own is None:
            own = self.cached.get(seq_id, 0)
        link = self.borrowed.get(seq_id)
        return own + link[1] if link else own

    def can_admit(self, num_cells: int, headroom: int = 0) -> bool:
        """A sequence id and `num_cells` cells (`headroom` more kept), evicting cached prefixes if need be."""
        has_id = bool(self.free_seq_ids) or bool(self.cached)
        return has_id and num_cells + headroom <= self.num_free_cells + self.num_cached_cells

    def admit(self, num_cells: int, borrow: tuple[int, int] | None = None) -> int:
        """A free sequence id holding `num_cells` (the caller evicted what it had to first), its
        first cells borrowed from `borrow` = (lender, cells) if given."""
        seq_id = self.free_seq_ids.pop()
        if borrow is not None and borrow[1] > 0:
            self.borrowed[seq_id] = borrow
        self._set_live(seq_id, num_cells - self._base(seq_id))
        return seq_id

    def ensure(self, seq_id: int, num_cells: int) -> bool:
        """Grow a sequence to hold num_cells; False when the free cells do not cover it."""
        extra = num_cells - self.length(seq_id)
        if extra <= 0:
            return True
        if extra > self.num_free_cells:
            return False
        self.add(seq_id, extra)
        return True

    def add_each(self, extras: list[tuple[int, int]]) -> None:
        """`add` for each (live sequence, cells) of `extras`."""
        for seq_id, num_cells in extras:
            self.allocated[seq_id] += num_cells
            self.num_used_cells += num_cells

    def add(self, seq_id: int, num_cells: int) -> None:
        """A live sequence holds `num_cells` more (the caller found them free)."""
        self.allocated[seq_id] += num_cells
        self.num_used_cells += num_cells

    def release(self, seq_id: int) -> None:
        self._shrink(seq_id, 0)
        self._set_live(seq_id, None)
        self.free_seq_ids.append(seq_id)

    def cache(self, seq_id: int, num_cells: int) -> None:
        """A live sequence ends and keeps its first `num_cells` as a cached prefix."""
        self._shrink(seq_id, num_cells)
        own = self.allocated[seq_id]
        self._set_live(seq_id, None)
        self._set_cached(seq_id, own)

    def reuse(self, seq_id: int, num_cells: int) -> None:
        """A cached prefix becomes a live sequence again, holding its first `num_cells`."""
        self._shrink(seq_id, num_cells)
        own = self.cached[seq_id]
        self._set_cached(seq_id, None)
        self._set_live(seq_id, own)

    def trim(self, seq_id: int, num_cells: int) -> None:
        """A cached prefix keeps only its first `num_cells`."""
        self._shrink(seq_id, num_cells)

    def evict(self, seq_id: int) -> None:
        self._shrink(seq_id, 0)
        self._set_cached(seq_id, None)
        self.free_seq_ids.append(seq_id)

    def _base(self, seq_id: int) -> int:
        link = self.borrowed.get(seq_id)
        return link[1] if link else 0

    def _shrink(self, seq_id: int, num_cells: int) -> None:
        """`seq_id` keeps only its first `num_cells` (0: none): its count and its borrowed part
        shrink, and its borrowers are counted for the cells they held through it."""
        base, link = self._base(seq_id), self.borrowed.get(seq_id)
        own_now = self.allocated.get(seq_id, self.cached.get(seq_id, 0))
        own = max(min(own_now, num_cells - base), 0)
        if num_cells < base:
            if num_cells > 0:
                self.borrowed[seq_id] = (self.borrowed[seq_id][0], num_cells)
            else:
                del self.borrowed[seq_id]
        if seq_id in self.allocated:
            self._set_live(seq_id, own)
        elif seq_id in self.cached:
            self._set_cached(seq_id, own)
        kept = min(num_cells, base + own)
        for borrower, (lender, cells) in list(self.borrowed.items()):
            if lender != seq_id or cells <= kept:
                continue
            if kept > 0:
                self.borrowed[borrower], still = (seq_id, kept), kept
            elif link is not None:  # gone whole: what it borrowed itself, the borrower borrows from its lender
                still = min(link[1], cells)
                self.borrowed[borrower] = (link[0], still)
            else:
                del self.borrowed[borrower]
                still = 0
            if borrower in self.allocated:
                self._set_live(borrower, self.allocated[borrower] + cells - still)
            else:
                self._set_cached(borrower, self.cached[borrower] + cells - still)

    def _set_live(self, seq_id: int, num_cells: int | None) -> None:
        self.num_used_cells += (num_cells or 0) - self.allocated.pop(seq_id, 0)
        if num_cells is not None:
            self.allocated[seq_id] = num_cells

    def _set_cached(self, seq_id: int, num_cells: int | None) -> None:
        self.num_cached_cells += (num_cells or 0) - self.cached.pop(seq_id, 0)
        if num_cells is not None:
            self.cached[seq_id] = num_cells
