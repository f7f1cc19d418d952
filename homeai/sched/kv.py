"""KV bookkeeping: which sequence ids are free and how many cells of the unified cache each holds.

Cells are counted, not placed: llama.cpp places them. A sequence holds one cell per
computed token; admission reserves cells for a request's whole current length so a
chunked prefill never runs dry halfway, and decoding grows a sequence one cell a step.
"""

from __future__ import annotations


class KVManager:
    def __init__(self, num_cells: int, num_seqs: int, first_id: int = 0):
        self.num_cells = num_cells
        self.free_seq_ids = list(range(first_id + num_seqs - 1, first_id - 1, -1))
        self.allocated: dict[int, int] = {}

    @property
    def num_used_cells(self) -> int:
        return sum(self.allocated.values())

    @property
    def num_free_cells(self) -> int:
        return self.num_cells - self.num_used_cells

    def can_admit(self, num_cells: int, headroom: int = 0) -> bool:
        return bool(self.free_seq_ids) and num_cells + headroom <= self.num_free_cells

    def admit(self, num_cells: int) -> int:
        seq_id = self.free_seq_ids.pop()
        self.allocated[seq_id] = num_cells
        return seq_id

    def ensure(self, seq_id: int, num_cells: int) -> bool:
        """Grow a sequence to hold num_cells; False when the cache is full."""
        extra = num_cells - self.allocated[seq_id]
        if extra <= 0:
            return True
        if extra > self.num_free_cells:
            return False
        self.allocated[seq_id] = num_cells
        return True

    def release(self, seq_id: int) -> None:
        del self.allocated[seq_id]
        self.free_seq_ids.append(seq_id)
