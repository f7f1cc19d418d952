"""The KV pools: which cache a sequence lives in, its id and cells there, and who gives way.

One pool per llama.cpp cache: `MAIN` (every generating lane's, or background's when the
interactive lanes have their own), `INTERACTIVE` (that own cache, when `interactive_cells` > 0)
and `EMBED` (the embedding context). A sequence id is the id within its pool's cache, so the
runner keeps one context per pool and translates nothing.

`KVPools` admits a request (a free sequence id and cells for its whole current length, so a
chunked prefill never runs dry halfway), grows a sequence by its next tokens (preempting by
recompute the lowest-priority, latest-admitted holder of the same pool when it is full),
releases, and collects the releases the runner applies before the next step. Every sequence
comes in through `admit` and leaves through `release` or `preempt`, and room is made only in
`grow`: that is where a pool may later keep a finished sequence's cells as an evictable cached
prefix (kept in `release`, evicted first in `grow`) without its callers changing.
"""

from __future__ import annotations

import enum

from homeai.sched.kv import KVManager
from homeai.sched.request import Kind, Request, Status


class Pool(enum.Enum):
    MAIN = "main"
    INTERACTIVE = "interactive"
    EMBED = "embed"


GENERATE = (Pool.INTERACTIVE, Pool.MAIN)  # the generating pools, decoded in this order


class KVPools:
    def __init__(self, *, num_cells: int, num_seqs: int, interactive_cells: int, embed_cells: int, embed_seqs: int):
        self.kv = {Pool.MAIN: KVManager(num_cells, num_seqs), Pool.EMBED: KVManager(embed_cells, embed_seqs)}
        if interactive_cells:
            self.kv[Pool.INTERACTIVE] = KVManager(interactive_cells, num_seqs)
        # Where the interactive lanes' sequences live: their own cache, or the main one beside background.
        self.interactive = Pool.INTERACTIVE if interactive_cells else Pool.MAIN
        self.generating = tuple(p for p in GENERATE if p in self.kv)
        self.running: list[Request] = []  # generating sequences, in admission order
        self.embedding: list[Request] = []  # embedding inputs admitted and not yet done
        self.version = 0  # changes whenever `running` does (what admission computed from it may be reused)
        self._releases: dict[Pool, list[int]] = {}

    @property
    def separate(self) -> bool:
        """The interactive lanes have a cache of their own: a decode call and cells apart from background's."""
        return self.interactive is Pool.INTERACTIVE

    def of_class(self, interactive: bool) -> Pool:
        return self.interactive if interactive else Pool.MAIN

    def of(self, request: Request) -> Pool:
        if request.kind is Kind.EMBED:
            return Pool.EMBED
        return self.of_class(request.interactive)

    def fits(self, pool: Pool, num_cells: int, headroom: int = 0) -> bool:
        """A free sequence id and `num_cells` cells, `headroom` more kept free."""
        return self.kv[pool].can_admit(num_cells, headroom)

    def num_free_seqs(self, pool: Pool) -> int:
        return len(self.kv[pool].free_seq_ids)

    def admit(self, request: Request) -> None:
        """Give a waiting request a sequence and cells for its whole current length (check `fits` first)."""
        pool = self.of(request)
        request.seq_id = self.kv[pool].admit(request.num_tokens)
        request.status = Status.RUNNING
        if pool is Pool.EMBED:
            self.embedding.append(request)
        else:
            self.running.append(request)
            self.version += 1

    def grow(self, request: Request, num_cells: int) -> tuple[bool, list[Request]]:
        """Make room for a sequence's next tokens, preempting holders of its pool when it is full.
        Returns whether it grew and whom it preempted (itself, when it could not grow)."""
        pool = self.of(request)
        preempted: list[Request] = []
        while not self.kv[pool].ensure(request.seq_id, num_cells):
            victim = self.victim(pool)
            if victim is None or victim is request:
                self.preempt(request)
                return False, [*preempted, request]
            self.preempt(victim)
            preempted.append(victim)
        return True, preempted

    def victim(self, pool: Pool | None = None) -> Request | None:
        """The lowest-priority, latest-admitted running request (holding cells in `pool`, if given)."""
        ranked = [(r.priority, i, r) for i, r in enumerate(self.running) if pool is None or self.of(r) is pool]
        return max(ranked, key=lambda t: t[:2])[2] if ranked else None

    def preempt(self, request: Request) -> None:
        """Drop a generating sequence's cells; the request keeps its output and computes it again."""
        self.release(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = Status.WAITING

    def release(self, request: Request) -> None:
        """Give a sequence's id and cells back (the runner drops them before the next step)."""
        if request.seq_id is None:
            return
        pool = self.of(request)
        (self.embedding if pool is Pool.EMBED else self.running).remove(request)
        if pool is not Pool.EMBED:
            self.version += 1
        self.kv[pool].release(request.seq_id)
        self._releases.setdefault(pool, []).append(request.seq_id)
        request.seq_id = None

    def take_releases(self) -> dict[Pool, list[int]]:
        releases, self._releases = self._releases, {}
        return releases

    def cells_used(self, pool: Pool) -> int:
        return self.kv[pool].num_used_cells
