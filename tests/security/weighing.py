"""What llama.cpp costs to weigh one token of the whole vocabulary under a grammar, in CPU seconds of
the calling thread (the engine and the server's threads in the same process do not count), for the
grammar-cost tests: after a given text, or along a random walk of tokens the grammar allows."""

from __future__ import annotations

import ctypes
import time

import llama_cpp as ll
import numpy as np

from homeai.llama.sampling import Candidates, grammar_sampler
from homeai.sched.request import Grammar


class Weigher:
    def __init__(self, runner):
        self.runner = runner
        self.candidates = Candidates(runner.n_vocab)
        self.logits = np.random.default_rng(0).random(runner.n_vocab, dtype=np.float32)

    def after(self, gbnf: str, text: str, tries: int = 3) -> float:
        """The least of `tries` weighings once the grammar has taken `text`'s tokens (each one it allows)."""
        sampler = self._sampler(gbnf)
        try:
            for token in self.runner.tokenize(text, add_special=False):
                assert self.candidates.allows(sampler, token), text  # else llama.cpp aborts on accept
                ll.llama_sampler_accept(sampler, token)
            return min(self._weigh(sampler)[0] for _ in range(tries))
        finally:
            ll.llama_sampler_free(sampler)

    def walk(self, gbnf: str, steps: int, seed: int = 0) -> float:
        """The most one weighing took along `steps` tokens, each one the grammar allows taken at random."""
        sampler, rng, most = self._sampler(gbnf), np.random.default_rng(seed), 0.0
        try:
            for _ in range(steps):
                took, allowed = self._weigh(sampler)
                most = max(most, took)
                allowed = [t for t in allowed if not ll.llama_vocab_is_eog(self.runner.vocab, int(t))]
                if not allowed:
                    break
                ll.llama_sampler_accept(sampler, int(allowed[rng.integers(len(allowed))]))
            return most
        finally:
            ll.llama_sampler_free(sampler)

    def _sampler(self, gbnf: str):
        sampler = grammar_sampler(self.runner.vocab, Grammar(gbnf))
        assert sampler, gbnf[:300]
        return sampler

    def _weigh(self, sampler) -> tuple[float, np.ndarray]:
        cur = self.candidates.fill(self.logits)
        start = time.thread_time()
        ll.llama_sampler_apply(sampler, ctypes.byref(cur))
        took = time.thread_time() - start
        data = self.candidates.data[:cur.size]
        return took, data["id"][np.isfinite(data["logit"])].copy()
