"""The grammar checker's process: a new grammar built and walked toward its end on the model's
vocabulary alone, away from the daemon (`homeai.engine.grammar_check` starts it as
`python -m homeai.llama.grammar_worker MODEL FD` and shares its checks among members).

A grammar llama.cpp cannot take may crash it (a stack overflow in its recursive parser), take
minutes to build or to weigh a token, or write its whole text to stderr when refused: here that
costs this process only. The build runs in a thread with a small stack (`CHECK_STACK_BYTES`),
smaller than any of the daemon's, and each token is weighed as the engine weighs it when the
model's pick is refused, in the same chunks (`sampling.CHUNK`), in the thread's own CPU time.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import llama_cpp as ll
import numpy as np

from homeai.llama.model import init_backend, token_text
from homeai.llama.sampling import CHUNK, Candidates

CHECK_STACK_BYTES = 1 << 20  # the checker builds grammars on a stack smaller than any of the daemon's threads'


def grammar_worker(model_path: str, conn) -> None:
    """The grammar checker's process (`homeai.engine.grammar_check`): the model's vocabulary only;
    for each (text, root, walks, walk_tokens, budget_s, max_token_ms) received, why llama.cpp cannot
    take the grammar ("": it can). llama.cpp's messages (a refused grammar's whole text among them)
    go to a scratch file, of which the first line is the reason."""
    scratch = tempfile.TemporaryFile()
    os.dup2(scratch.fileno(), 2)
    init_backend()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(model_path.encode(), params)
    vocab = ll.llama_model_get_vocab(model)
    walker = _Walker(vocab)
    conn.send("ready")

    def serve() -> None:
        while True:
            try:
                text, root, walks, walk_tokens, budget_s, max_token_ms = conn.recv()
            except EOFError:
                return
            scratch.seek(0)
            scratch.truncate()
            why = _try_grammar(walker, text, root, walks, walk_tokens, budget_s, max_token_ms)
            conn.send(_first_line(scratch) if why == "" else why or "")

    threading.stack_size(CHECK_STACK_BYTES)
    thread = threading.Thread(target=serve, name="grammar-check")
    thread.start()
    thread.join()


RETRIES = 2  # a weighing a little past the limit is repeated (one slowed by a cache or page miss: 66 ms, then 22)


class _Walker:
    """What the checker walks a grammar with: the vocabulary's candidates, each token's length, which
    hold a quote (in a string: its end), which a bracket (elsewhere: an array's or object's end),
    and which end generation."""

    def __init__(self, vocab):
        n = ll.llama_vocab_n_tokens(vocab)
        self.vocab, self.candidates = vocab, Candidates(n)
        texts = [token_text(vocab, t) for t in range(n)]
        self.length = np.array([len(t) for t in texts], dtype=np.int32)
        self.quote = np.array(['"' in t for t in texts])
        self.bracket = np.array([("]" in t or "}" in t) and '"' not in t for t in texts])
        self.eog = np.array([bool(ll.llama_vocab_is_eog(vocab, t)) for t in range(n)])
        self.logits = np.random.default_rng(0).random(n, dtype=np.float32)

    def weigh(self, sampler) -> tuple[np.ndarray, float]:
        """The tokens the grammar allows, from a pass over the whole vocabulary in the engine's chunks
        (a part cannot tell the whole's cost: it lies in a few paths through the tokens' characters,
        not in their number; and with many stacks each chunk costs nearly a whole pass), and the
        pass's CPU time in ms (its thread's own: the box's other work does not count)."""
        ids = self.candidates.ids
        began = time.thread_time()
        ok = np.concatenate([self.candidates.weigh(sampler, ids[i:i + CHUNK], self.logits)
                             for i in range(0, len(ids), CHUNK)])
        return ids[ok], (time.thread_time() - began) * 1000.0

    def choose(self, allowed: np.ndarray, rng) -> int:
        """A token that moves the walk on: one that ends a string, or else an array or object (free
        text is walked through, not into), the longest (a literal's rest), or any."""
        roll = rng.random()
        for kind, below in ((self.quote, 0.5), (self.bracket, 0.7)):
            closing = allowed[kind[allowed]]
            if roll < below and len(closing):
                return int(closing[rng.integers(len(closing))])
        if roll < 0.85:
            lengths = self.length[allowed]
            longest = allowed[lengths >= lengths.max()]
            return int(longest[rng.integers(len(longest))])
        return int(allowed[rng.integers(len(allowed))])


def _try_grammar(walker: _Walker, text: str, root: str, walks: int, walk_tokens: int, budget_s: float,
                 max_token_ms: float) -> str | None:
    """Build the grammar and walk it `walks` times, each up to `walk_tokens` tokens or its end, for at
    most half of `budget_s` in all, each token weighed against the whole vocabulary (timed) and one
    chosen to move on (`_Walker.choose`). Why not (a token's weighing or taking past `max_token_ms`,
    the build past `budget_s`); None when it went, "" when llama.cpp refused it."""
    start = time.perf_counter()
    sampler = ll.llama_sampler_init_grammar(walker.vocab, text.encode("utf-8"), root.encode("utf-8"))
    if not sampler:
        return ""
    rng = np.random.default_rng(len(text))
    try:
        for walk in range(walks):
            if walk:  # each walk from the start
                ll.llama_sampler_reset(sampler)
            for _ in range(walk_tokens):
                if time.perf_counter() - start > budget_s / 2:
                    break  # walked as far as the time allows
                allowed, ms = walker.weigh(sampler)
                for _ in range(RETRIES if max_token_ms < ms < 4 * max_token_ms else 0):  # the least counts
                    ms = min(ms, walker.weigh(sampler)[1])
                if ms > max_token_ms:
                    return (f"llama.cpp took {ms:.0f} ms to weigh one token of it against the vocabulary "
                            f"(at most {max_token_ms:g} ms: [grammar] max_token_ms)")
                moving = allowed[~walker.eog[allowed]]
                if not len(moving):
                    break  # its end (or a place no token can write)
                before = time.thread_time()
                ll.llama_sampler_accept(sampler, walker.choose(moving, rng))
                ms = (time.thread_time() - before) * 1000.0
                if ms > max_token_ms:
                    return f"llama.cpp took {ms:.0f} ms to take one token of it (at most {max_token_ms:g} ms)"
    finally:
        ll.llama_sampler_free(sampler)
    took = time.perf_counter() - start
    if took > budget_s:
        return f"llama.cpp took {took:.1f} s to build it and weigh its tokens (at most {budget_s:g} s)"
    return None


def _first_line(scratch) -> str:
    """llama.cpp's reason for refusing a grammar: the first line it wrote, cut short."""
    scratch.seek(0)
    line = scratch.read(4096).decode("utf-8", "replace").strip().split("\n", 1)[0]
    return "llama.cpp refused its grammar: " + (line.split("error parsing grammar: ", 1)[-1][:200] or "no reason given")


if __name__ == "__main__":  # the grammar checker's process (`grammar_check`): python -m homeai.llama.grammar_worker MODEL FD
    import sys
    from multiprocessing.connection import Connection

    grammar_worker(sys.argv[1], Connection(int(sys.argv[2])))
