"""The batch one `llama_decode` reads: tokens, positions, sequence ids and which rows want logits.

Its arrays are numpy buffers the `llama_batch` points into, so filling a step is a few
assignments a row (a chunk's by slices), not a Python loop over tokens.
"""

from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np


class Batch:
    """A llama_batch whose arrays are numpy buffers, one sequence id per token."""

    def __init__(self, capacity: int):
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        row = ctypes.POINTER(ctypes.c_int32)
        base = self.seq.ctypes.data
        self.seq_ptrs = (row * capacity)(*[ctypes.cast(base + 4 * i, row) for i in range(capacity)])
        self.num_outputs = 0  # rows of the last fill that want logits
        self.c = ll.llama_batch()
        self.c.token = self.token.ctypes.data_as(ctypes.POINTER(ll.llama_token))
        self.c.embd = None
        self.c.pos = self.pos.ctypes.data_as(ctypes.POINTER(ll.llama_pos))
        self.c.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.c.seq_id = ctypes.cast(self.seq_ptrs, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id)))
        self.c.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(self, rows: list[tuple[int, int, list[int], bool]]) -> list[int]:
        """Rows are (seq_id, start, tokens, wants): logits for the last `wants` tokens (a bool: the last
        one or none; a drafted decode wants every token's); returns each row's last index (and counts
        the tokens wanting logits, `num_outputs`). A
        decode row (one token) is written element by element: a numpy slice assignment costs ~3,000
        instructions, an element ~800 (so up to ~16 decode rows cost less than a column at a time)."""
        token, pos, seq, logits = self.token, self.pos, self.seq, self.logits
        n = outputs = 0
        last = []
        for seq_id, start, tokens, wants in rows:
            k = len(tokens)
            if k == 1:
                token[n] = tokens[0]
                pos[n] = start
                seq[n] = seq_id
                logits[n] = wants
            else:
                token[n:n + k] = tokens
                pos[n:n + k] = np.arange(start, start + k, dtype=np.int32)
                seq[n:n + k] = seq_id
                logits[n:n + k] = 0
                if wants:
                    logits[n + k - wants:n + k] = 1
            n += k
            outputs += wants
            last.append(n - 1)
        self.c.n_tokens = n
        self.num_outputs = outputs  # the rows llama.cpp computes logits for
        return last


class EmbdBatch(Batch):
    """A batch of embeddings (an image's rows from the projector, `vision`), one sequence id a row, no
    logits: the same buffers, the tokens' array unused."""

    def __init__(self, capacity: int, n_embd: int):
        super().__init__(capacity)
        self.embd = np.zeros((capacity, n_embd), dtype=np.float32)
        self.c.token = None
        self.c.embd = self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def fill_embeddings(self, rows: list[tuple[int, int, np.ndarray]]) -> None:
        """Rows are (seq_id, start position, embeddings)."""
        n = 0
        for seq_id, start, embd in rows:
            k = len(embd)
            self.embd[n:n + k] = embd
            self.pos[n:n + k] = np.arange(start, start + k, dtype=np.int32)
            self.seq[n:n + k] = seq_id
            n += k
        self.logits[:n] = 0
        self.num_outputs = 0
        self.c.n_tokens = n
