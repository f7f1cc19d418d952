"""The KV pools: which cache a sequence lives in, its id and cells there, and who gives way.

One pool per llama.cpp cache: `MAIN` (every generating lane's, or background's when the
interactive lanes have their own), `INTERACTIVE` (that own cache, when the layout has one:
`layout.py`) and `EMBED` (the embedding context). A sequence id is the id within its pool's cache, so the
runner keeps one context per pool and translates nothing.

`KVPools` admits a request (a sequence id and cells for its whole current length, so a
chunked prefill never runs dry halfway), grows a sequence by its next tokens (preempting by
recompute the lowest-priority, latest-admitted holder of the same pool when it is full),
releases, and collects the cache operations (`Drop`, `Copy`) the runner applies, in order,
before the next step. Every sequence comes in through `admit` and leaves through `release`
or `preempt`. It keeps KV facts only (a sequence id, the tokens computed): a request's status,
queue and counts are the scheduler's.

With the prompt cache on, what a sequence leaves behind stays as a cached prefix a later request
may start from (`reuse.py`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from homeai.sched.kv import KVManager
from homeai.sched.ops import Copy, Drop
from homeai.sched.prefix import HEAD, Memory, PrefixCache
from homeai.sched.request import Pool, Request
from homeai.sched.reuse import PromptCache, Reuse

__all__ = ["GENERATE", "Copy", "Drop", "KVPools", "Pool", "PromptCache", "Spare"]

GENERATE = (Pool.INTERACTIVE, Pool.MAIN)  # the generating pools, decoded in this order
Spare = Callable[[Request], bool]  # a running request that keeps its cells when another needs room


class KVPools(Reuse):
    """The pools' sequences and cells, and who gives way (the prompt cache's part: `Reuse`)."""

    def __init__(self, *, caches: dict[Pool, KVManager], interactive: Pool, embed_cells: int, embed_seqs: int,
                 prompt_cache: PromptCache = PromptCache(), memory: Memory = Memory()):
        """`caches`: the generating caches the layout made (`layout.py`); `interactive`: the one the
        interactive lanes' sequences live in (their own, or the main one beside background);
        `memory`: where the model's sequences may be resumed (`prefix.Memory`)."""
        self.kv = {**caches, Pool.EMBED: KVManager(embed_cells, embed_seqs)}
        self.interactive = interactive
        self.generating = tuple(p for p in GENERATE if p in self.kv)
        self.running: list[Request] = []  # generating sequences, in admission order
        self.embedding: list[Request] = []  # embedding inputs admitted and not yet done
        self.version = 0  # changes whenever `running` does (what admission computed from it may be reused)
        self.settings = prompt_cache
        self.cache = {pool: PrefixCache() for pool in self.generating} if prompt_cache.enabled else {}
        self.min_reuse = max(prompt_cache.min_reuse, HEAD)
        self._ops: dict[Pool, list[Drop | Copy]] = {}
        self.memory = memory
        # Sequences given a prefix by a `Copy` not yet applied (llama.cpp holds none of their cells
        # yet), and those cut short by a `Drop` not yet applied (which a recurrent state refuses)
        self._copied: set[tuple[Pool, int]] = set()
        self._cut: dict[tuple[Pool, int], int] = {}  # (pool, seq id) -> the lowest pending cut
        self._victims: tuple[int, dict[Pool | None, Request | None]] = (-1, {})  # `victim`'s, per version

    def of_class(self, interactive: bool) -> Pool:
        """A class's own pool (a request's own is `Request.pool`: its class's, or another admission placed it in)."""
        return self.interactive if interactive else Pool.MAIN

    def fits(self, pool: Pool, num_cells: int, headroom: int = 0) -> bool:
        """A sequence id and `num_cells` cells, `headroom` more kept free (cached prefixes evicted)."""
        return self.kv[pool].can_admit(num_cells, headroom)

    def num_free_seqs(self, pool: Pool) -> int:
        """Sequence ids free or held by cached prefixes."""
        return len(self.kv[pool].free_seq_ids) + len(self.kv[pool].cached)

    # ---- in and out ------------------------------------------------------------------

    def admit(self, request: Request) -> None:
        """Give a waiting request a sequence and cells for its whole current length (check `fits`
        first), starting it at the longest prefix it may reuse."""
        pool = request.pool
        if pool in self.cache:
            self._admit_reusing(request, pool)
        else:
            self._make_room(pool, request.num_tokens, need_seq=True)
            request.seq_id = self.kv[pool].admit(request.num_tokens)
        if pool is Pool.EMBED:
            self.embedding.append(request)
        else:
            self.running.append(request)
            self.version += 1

    def grow(self, request: Request, num_cells: int, spare: Spare | None = None) -> tuple[bool, list[Request]]:
        """Make room for a sequence's next tokens, evicting cached prefixes, then preempting
        holders of its pool (none that `spare` keeps). Returns whether it grew and whom it
        preempted (itself, when it could not)."""
        pool = request.pool
        preempted: list[Request] = []
        while not self.kv[pool].ensure(request.seq_id, num_cells):
            if self._evict_oldest(pool):
                continue
            victim = self.victim(pool, spare)
            if victim is None or victim is request:
                self.preempt(request)
                return False, [*preempted, request]
            self.preempt(victim)
            preempted.append(victim)
        return True, preempted

    def grow_decodes(self, requests: list[Request]) -> bool:
        """Give each of `requests` (running sequences) a cell for its next token, when the free
        cells of its pool cover them all: nothing is evicted or preempted then, so this is what
        `grow` one at a time would do, without asking who would give way. False, with nothing
        done, when they do not (`grow` them one at a time)."""
        lacking: dict[Pool, list[tuple[int, int]]] = {}  # per pool, (sequence, cells it lacks)
        kvs = self.kv
        for r in requests:
            kv, seq_id = kvs[r.pool], r.seq_id
            own = kv.allocated.get(seq_id)  # `kv.length(seq_id)`, inlined: every decode, every step
            if own is None:
                own = kv.cached.get(seq_id, 0)
            link = kv.borrowed.get(seq_id)
            extra = r.num_computed_tokens + 1 - (own + link[1] if link else own)
            if extra > 0:
                lack = lacking.get(r.pool)
                if lack is None:
                    lack = lacking[r.pool] = []
                lack.append((seq_id, extra))
        for pool, lack in lacking.items():
            if sum([n for _, n in lack]) > kvs[pool].num_free_cells:
                return False
        for pool, lack in lacking.items():
            kvs[pool].add_each(lack)
        return True

    def victim(self, pool: Pool | None = None, spare: Spare | None = None) -> Request | None:
        """The lowest-priority, latest-admitted running request (holding cells in `pool`, if given);
        one that `spare` keeps (background at its floor) only when no other could give way."""
        if spare is None:  # a function of the running set alone: ranked again only when it changed
            if self._victims[0] != self.version:
                self._victims = self.version, {}
            if pool not in self._victims[1]:
                self._victims[1][pool] = self._victim(pool, None)
            return self._victims[1][pool]
        return self._victim(pool, spare)

    def _victim(self, pool: Pool | None, spare: Spare | None) -> Request | None:
        ranked = [(r.priority, i, r) for i, r in enumerate(self.running) if pool is None or r.pool is pool]
        kept = [t for t in ranked if not (spare and spare(t[2]))] or ranked
        return max(kept, key=lambda t: t[:2])[2] if kept else None

    def preempt(self, request: Request) -> None:
        """Drop a generating sequence (its cells may stay cached); the request keeps its output
        and computes it again, from whatever of it is still cached when it comes back (its
        status and queue are the scheduler's: `Scheduler._requeue`)."""
        self.release(request)
        request.num_computed_tokens = 0

    def release(self, request: Request) -> None:
        """Give a sequence's id back, and its cells (or keep them as a cached prefix)."""
        if request.seq_id is None:
            return
        pool, seq_id = request.pool, request.seq_id
        kv = self.kv[pool]
        (self.embedding if pool is Pool.EMBED else self.running).remove(request)
        if pool is not Pool.EMBED:
            self.version += 1
        request.seq_id = None
        computed = request.num_computed_tokens
        if pool in self.cache and computed >= self.min_reuse:
            kv.cache(seq_id, computed)
            self.cache[pool].add(seq_id, np.asarray(request.tokens_slice(0, computed), dtype=np.int32),
                                 request.member, request.public_len, request.group, request.client_len)
            self._op(pool, Drop(seq_id, computed))  # cells past what was computed (an aborted chunk) go
            self._cap(pool, seq_id)
        else:
            kv.release(seq_id)
            self._op(pool, Drop(seq_id))

    def history(self, request: Request, turns: int) -> list[tuple[tuple[Pool, int], np.ndarray]]:
        """The member's own latest cached sequences (a proxy's user: their own), latest first, at most
        `turns`: each (pool, seq id) and its tokens. What drafting looks in (`draft.py`), never another's."""
        mine = [(entry.last_use, pool, entry) for pool, cache in self.cache.items() for entry in cache.entries.values()
                if entry.member == request.member and entry.group == request.group]
        mine.sort(key=lambda t: -t[0])
        return [((pool, entry.seq_id), entry.tokens) for _, pool, entry in mine[:turns]]

    def take_ops(self) -> dict[Pool, list[Drop | Copy]]:
        """The cache operations since the last call, per pool, in the order they must run."""
        ops, self._ops = self._ops, {}
        self._copied.clear()
        self._cut.clear()
        return ops

    def cells_used(self, pool: Pool) -> int:
        return self.kv[pool].num_used_cells

    def cells_cached(self, pool: Pool) -> int:
        return self.kv[pool].num_cached_cells

    def _op(self, pool: Pool, op: Drop | Copy) -> None:
        if pool is Pool.EMBED and not isinstance(op, Drop):
            raise AssertionError("the embedding context shares no cells")
        if isinstance(op, Drop) and op.start:
            key = (pool, op.seq_id)
            self._cut[key] = min(self._cut.get(key, op.start), op.start)
        self._ops.setdefault(pool, []).append(op)
