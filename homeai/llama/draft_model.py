"""A draft model (`[speculative] draft_path`): a smaller model with the served model's vocabulary,
guessing an answer's next tokens where its own tokens guess nothing (`homeai.sched.draft`).

It keeps a context of its own, one sequence for each of the served model's generating sequences
(the interactive cache's ids first, then the main cache's), holding the tokens it has read of that
answer. Each step it is asked for a guess, it catches its sequence up with the answer (cutting what
differs: a refused guess, another request in the same id) by at most `CATCH_UP` tokens a step, so a
long prompt is read over several steps rather than stall one; once caught up it decodes its greedy
guesses, every sequence's together, a token a call. What it guesses is checked as any guess is
(`drafts.verify`), so it changes no answer, only how many tokens a step gives.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as ll
import numpy as np

from homeai.config import ModelConfig
from homeai.llama.batch import Batch
from homeai.llama.model import RunnerError, flash_attn_type, load_model, new_context
from homeai.sched.pools import Pool

CATCH_UP = 256  # the most tokens a sequence catches up by in one step


def vocabularies_differ(vocab, other) -> str | None:
    """Why two vocabularies are not the same (None: they are): their sizes, or the first token whose text differs."""
    n, m = ll.llama_vocab_n_tokens(vocab), ll.llama_vocab_n_tokens(other)
    if n != m:
        return f"{m} tokens against the served model's {n}"
    buf, other_buf = ctypes.create_string_buffer(256), ctypes.create_string_buffer(256)
    for token in range(n):
        a = ll.llama_token_to_piece(vocab, token, buf, 256, 0, True)
        b = ll.llama_token_to_piece(other, token, other_buf, 256, 0, True)
        if a != b or buf.raw[:max(a, 0)] != other_buf.raw[:max(b, 0)]:
            return f"token {token} is {other_buf.raw[:max(b, 0)]!r} there, {buf.raw[:max(a, 0)]!r} here"
    return None


class DraftModel:
    """The draft model's weights, context and what each of its sequences holds."""

    def __init__(self, path: Path, cfg: ModelConfig, vocab, n_ctx: int, n_seq_max: int, threads: int):
        self.model = load_model(path, cfg)
        self.path = path
        why = vocabularies_differ(vocab, ll.llama_model_get_vocab(self.model))
        if why is not None:
            ll.llama_model_free(self.model)
            raise RunnerError(f"the draft model {path} has another vocabulary than the served model ({why}): "
                              "[speculative] draft_path must name a model of the same family and tokenizer")
        self.n_seq_max = n_seq_max
        self.ctx = new_context(self.model, n_ctx=n_ctx, n_batch=cfg.n_batch, n_seq_max=2 * n_seq_max,
                               n_threads=threads, embeddings=False, flash_attn=flash_attn_type(cfg))
        self.memory = ll.llama_get_memory(self.ctx)
        self.n_vocab = ll.llama_vocab_n_tokens(vocab)
        self.batch = Batch(cfg.n_batch)
        self.held: dict[int, list[int]] = {}  # a draft sequence's tokens, as its cells hold them

    def seq(self, pool: Pool, seq_id: int) -> int:
        return seq_id if pool is Pool.INTERACTIVE else self.n_seq_max + seq_id

    def drop(self, pool: Pool, seq_id: int, start: int) -> None:
        """The served model's cache dropped a sequence's cells from `start` on: so does this one."""
        seq = self.seq(pool, seq_id)
        ll.llama_memory_seq_rm(self.memory, seq, start, -1)
        held = self.held.get(seq)
        if held is not None:
            del held[start:]

    def guesses(self, wants: list[tuple[int, list[int], int]]) -> list[list[int]]:
        """For each (draft sequence, the answer's tokens so far, k): up to `k` greedy guesses of what
        follows, or none while the sequence is still catching up."""
        found: list[list[int]] = [[] for _ in wants]
        last: dict[int, int] = {}  # want -> its first guess, once caught up
        for n, (seq, tokens, k) in enumerate(wants):
            token = self._catch_up(seq, tokens)
            if token is not None:
                last[n] = token
                found[n].append(token)
        while True:  # a token a call, every caught-up sequence that wants more together
            going = [n for n in last if len(found[n]) < wants[n][2]]
            if not going:
                return found
            rows = [(wants[n][0], len(wants[n][1]) + len(found[n]) - 1, [found[n][-1]], True) for n in going]
            self.batch.fill(rows)
            if ll.llama_decode(self.ctx, self.batch.c) != 0:
                return [f[:1] for f in found]  # (out of cells: the first guesses still stand)
            picks = self._logits(len(going)).argmax(axis=1).tolist()
            for n, pick in zip(going, picks):
                self.held[wants[n][0]].append(found[n][-1])
                found[n].append(pick)

    def _catch_up(self, seq: int, tokens: list[int]) -> int | None:
        """Read what the sequence lacks of `tokens` (at most `CATCH_UP` this step); its greedy next token
        once it holds them all, else None."""
        held = self.held.setdefault(seq, [])
        same = 0
        for a, b in zip(held, tokens):
            if a != b:
                break
            same += 1
        same = min(same, len(tokens) - 1)  # the last token is read again: its row's logits are the guess's
        if same < len(held):
            ll.llama_memory_seq_rm(self.memory, seq, same, -1)
            del held[same:]
        todo = tokens[same:same + min(CATCH_UP, len(self.batch.token))]
        done = same + len(todo) == len(tokens)
        self.batch.fill([(seq, same, todo, done)])
        if ll.llama_decode(self.ctx, self.batch.c) != 0:
            ll.llama_memory_seq_rm(self.memory, seq, 0, -1)
            held.clear()
            return None
        held += todo
        return int(self._logits(1)[0].argmax()) if done else None

    def _logits(self, n: int) -> np.ndarray:
        address = ctypes.addressof(ll.llama_get_logits(self.ctx).contents)
        return np.frombuffer((ctypes.c_float * (n * self.n_vocab)).from_address(address),
                             dtype=np.float32).reshape(n, self.n_vocab)

    def close(self) -> None:
        ll.llama_free(self.ctx)
        ll.llama_model_free(self.model)
