"""The runner's batch: whatever the rows, each token lands at its index with its position, sequence
id and logits flag (only a wanting row's last token), and each row's last index comes back, whether
a row is a decode (one token, written element by element) or a chunk (written by slices)."""

from __future__ import annotations

import random

import pytest

from homeai.llama.batch import Batch


def _expected(rows):
    token, pos, seq, logits, last = [], [], [], [], []
    for seq_id, start, tokens, wants in rows:
        for k, t in enumerate(tokens):
            token.append(t)
            pos.append(start + k)
            seq.append(seq_id)
            logits.append(int(wants and k == len(tokens) - 1))
        last.append(len(token) - 1)
    return token, pos, seq, logits, last


def _filled(batch, n):
    return ([int(x) for x in batch.token[:n]], [int(x) for x in batch.pos[:n]], [int(x) for x in batch.seq[:n]],
            [int(x) for x in batch.logits[:n]])


@pytest.mark.parametrize("longest", [1, 5])
def test_every_token_lands_at_its_index(longest):
    rng = random.Random(longest)
    batch = Batch(64)
    for _ in range(200):
        batch.logits[:] = 1  # what an earlier step left must not leak into this one
        rows = [(rng.randrange(32), rng.randrange(1000), [rng.randrange(49152) for _ in range(rng.randint(1, longest))],
                 rng.random() < 0.8) for _ in range(rng.randint(1, 8))]
        token, pos, seq, logits, last = _expected(rows)
        assert batch.fill(rows) == last
        assert batch.c.n_tokens == len(token)
        assert _filled(batch, len(token)) == (token, pos, seq, logits)
        assert batch.num_outputs == sum(logits)  # the logits rows llama.cpp computes


def test_an_empty_step_fills_nothing():
    batch = Batch(8)
    assert batch.fill([]) == []
    assert batch.c.n_tokens == 0 and batch.num_outputs == 0
