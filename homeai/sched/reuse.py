"""The prompt cache in the KV pools: admission from the longest prefix a request may reuse, and
the cached entries' eviction (the room they make, their expiry, a proxy's preamble kept).

With the prompt cache on, a generating pool keeps what a sequence leaves behind as a cached
prefix (`prefix.py`): cells that count as free but reclaimable. Admission starts a request at
the longest prefix it shares with an entry (taking the entry over) or with a live sequence
(sharing its cells), and every lack of room evicts least recently used entries before it
would preempt or refuse anyone: an entry never pins memory a live request needs. Cells are
reused only by requests of the member whose request made them, beyond the leading tokens no
member wrote (`prefix.reusable`), unless `PromptCache.shared`: entries, live sequences and
the wait for a prefix another request is still reading all follow that rule. The users of one
trusted proxy also reuse each other's cells as far as their client wrote them (its preamble:
`Request.client_len`). A prefix is reused only where its sequence may be resumed exactly
(`prefix.Memory`: a sliding window's cells given away, a recurrent state that cannot be cut);
where it may not, the prompt is read again.

A proxy's preamble outlives its users' conversations while they come back (`_let_go`): an entry
that eviction would drop (least recently used, or not worth its keep: `expire`) and that is the
pool's last holder of its proxy's preamble is cut to the preamble instead, dropping only the
user's private tail. The preamble then counts as recent as the proxy's last request in the pool
(any user's), and its odds of reuse are the proxy's, not one user's; once no user of the proxy
has come for long enough that it is not worth its keep either, or the room is needed, it goes.

`Reuse` is a part of `KVPools` (`pools.py`), which holds the caches and sequences it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from homeai.sched.ops import Copy, Drop
from homeai.sched.prefix import HEAD, Entry, common_prefix, reader, reusable
from homeai.sched.request import Pool, Request


@dataclass(frozen=True)
class PromptCache:
    enabled: bool = False
    max_cells: int = 0  # cells the entries of one pool may hold; 0: any the live sequences leave
    min_reuse: int = 16  # the shortest shared prefix worth reusing (at least prefix.HEAD)
    # The odds an entry is used again, as eviction assumes them (`KVPools.expire`): lower frees
    # attention sooner for new prompts; higher keeps conversations warm through more other work.
    reuse_odds: float = 0.5
    # Every member reuses every member's prefixes (`scheduler.prompt_cache_shared`); False: only
    # the member whose request made them, and other members the leading tokens no member wrote.
    shared: bool = False


class Reuse:
    """The prompt cache's part of `KVPools`."""

    def fits_sharing(self, request: Request, pool: Pool, headroom: int = 0) -> bool:
        """Room in `pool` for a waiting request that would start from a live sequence's cells there
        (borrowed, counted once against their holder: `_admit_reusing`): a sequence id and its cells
        past them. Asked when its whole length does not fit: two users of one proxy, the first still
        writing its answer after the preamble both share, need the second's own text only, not a
        second preamble beside the first (which a cache sized for one would send to another cache
        to be read again). A cached entry's cells count as room already (`fits`)."""
        if pool not in self.cache:
            return False
        tokens = _prompt_array(request) if not request.output_tokens else \
            np.asarray(request.tokens_slice(0, request.num_tokens), dtype=np.int32)
        _live, n_live = self._best_live(request, pool, tokens, request.num_tokens - 1)
        return n_live >= self.min_reuse and self.kv[pool].can_admit(request.num_tokens - n_live, headroom)

    def computed(self, pool: Pool, num_tokens: int) -> None:
        """A step computed `num_tokens` in `pool`: its cached prefixes aged by that much work."""
        if pool in self.cache:
            self.cache[pool].work += num_tokens

    def expire(self, b_over_c: float) -> None:
        """Evict entries that have cost more than they could save. Every token a pool computes
        attends over every cell in use there, cached ones included (llama.cpp spans the cache up
        to its highest cell in use), at `c` ms per token per thousand cells; reading an entry's L
        tokens again costs about b·L + c·L²/2000 ms (each token `b`, and attention over the ones
        before it). So keeping L cells while the pool computes W tokens costs c·W·L/1000 and can
        save p times the reading, p the odds it is reused: past W = p·(1000·b/c + L/2), an entry
        not reused has cost more than it is likely to save. An idle box computes nothing, so its
        entries stay; a busy one keeps what is reused soon. Unless the cache is shared, only its
        member reuses an entry, and a member goes on with one conversation at a time: their
        entries share the odds (a flood's many leave soon, not slowing everyone's steps for long).
        A proxy's preamble is reused by any of its users: an entry holding only that is the
        proxy's, and its odds are shared among the proxy's such entries (`prefix.reader`); a stale
        entry that last holds one is cut to it while that is still worth its keep, counted from
        the proxy's last request in the pool (`_let_go`). (`b_over_c`: 1000·b/c.)"""
        for pool, cache in self.cache.items():
            if not cache.entries:
                continue
            held = cache.readers()
            odds = {m: self.settings.reuse_odds / (1 if self.settings.shared else n) for m, n in held.items()}
            stale = [e for e in cache.entries.values()  # computed beside for more than they would save
                     if cache.work - e.work_at_use > odds[reader(e)] * (b_over_c + len(e.tokens) / 2)]
            for entry in stale:
                group_odds = self.settings.reuse_odds / (held[("group", entry.group)] + 1)
                self._let_go(pool, entry, lambda work, length: cache.work - work <= group_odds * (b_over_c + length / 2))

    def drop_cached(self) -> None:
        """Evict every cached prefix (llama.cpp found no KV slot: whatever it holds, it gives back)."""
        for pool, cache in self.cache.items():
            for entry in list(cache.entries.values()):
                self._evict(pool, entry)

    def _admit_reusing(self, request: Request, pool: Pool) -> None:
        """Admit from the longest shared prefix: an entry mostly reused is taken over (its tail
        dropped); one barely reused, or a live sequence, shares its first cells with a new one."""
        kv, cache = self.kv[pool], self.cache[pool]
        entry, n_entry, live, n_live = self._match(request, pool)
        cache.seen(request.group)
        reused = max(n_entry, n_live)
        if reused < self.min_reuse:
            self._make_room(pool, request.num_tokens, need_seq=True)
            request.seq_id = kv.admit(request.num_tokens)
            return
        if n_entry >= n_live and (self._take_over(request, entry, n_entry) or not self._copy_room(pool, entry)):
            cache.remove(entry.seq_id)
            kv.reuse(entry.seq_id, n_entry)
            self._op(pool, Drop(entry.seq_id, n_entry))
            self._make_room(pool, request.num_tokens - n_entry, need_seq=False)
            request.seq_id = entry.seq_id
            kv.ensure(request.seq_id, request.num_tokens)
        else:
            src = entry.seq_id if n_entry >= n_live else live.seq_id
            if n_entry >= n_live:
                cache.touch(entry)
            self._make_room(pool, request.num_tokens - reused, need_seq=True, keep=src)
            request.seq_id = kv.admit(request.num_tokens, borrow=(src, reused))  # shared cells counted once
            self._op(pool, Copy(src, request.seq_id, reused))
            self._copied.add((pool, request.seq_id))
        request.num_computed_tokens = reused

    def _match(self, request: Request, pool: Pool) -> tuple[Entry | None, int, Request | None, int]:
        """The entry and the live sequence of `pool` whose prefix the request may reuse is longest,
        each with its length (pure: admission asks it of each cache a request may go in)."""
        tokens = _prompt_array(request) if not request.output_tokens else \
            np.asarray(request.tokens_slice(0, request.num_tokens), dtype=np.int32)  # preempted: its output too
        limit = request.num_tokens - 1  # the last token is computed again: its logits are sampled
        resumable = None if self.memory.cut_anywhere else (lambda seq_id, n: self._resumable(pool, seq_id, n))
        entry, n_entry = self.cache[pool].best(tokens, request.member, request.public_len, self.settings.shared,
                                               limit=limit, resumable=resumable, group=request.group,
                                               client_len=request.client_len)
        live, n_live = self._best_live(request, pool, tokens, limit)
        return entry, n_entry, live, n_live

    def prefix_in(self, request: Request, pool: Pool) -> int:
        """The longest prefix a waiting request would start from in `pool` (0: none worth reusing)."""
        if pool not in self.cache:
            return 0
        _, n_entry, _, n_live = self._match(request, pool)
        reused = max(n_entry, n_live)
        return reused if reused >= self.min_reuse else 0

    def _take_over(self, request: Request, entry: Entry, n_entry: int) -> bool:
        """An entry mostly reused becomes the request's sequence; another member's (another user's
        of the same proxy too) only when the request reuses all of it (else its owner's next turn
        would lose its private tail): a preamble alone, say, which the taker's own entry then holds."""
        if self.settings.shared or entry.member == request.member:
            return 2 * n_entry >= len(entry.tokens)
        return n_entry >= len(entry.tokens)

    def _reusable(self, request: Request, maker: Request | Entry, n: int) -> int:
        """How much of an `n`-token match with `maker`'s cells `request` may reuse."""
        return reusable(n, same_member=self.settings.shared or maker.member == request.member,
                        maker_public=maker.public_len, public_len=request.public_len,
                        same_group=bool(request.group) and maker.group == request.group,
                        maker_client=maker.client_len, client_len=request.client_len)

    def shares_a_prefix_being_read(self, request: Request, reading: list[Request] | None = None,
                                   pool: Pool | None = None) -> bool:
        """A running sequence of `pool` (the request's, if not given) is still reading a prefix (at
        least `min_reuse` tokens) the request shares: admitted now, the request would read it a second
        time beside it; a step or so later, it shares the cells instead. `reading`: the running
        sequences not decoding, when the caller has them (`Moment.running`; else every running one
        is looked at)."""
        pool = pool or request.pool
        if pool not in self.cache or request.num_preemptions or self.memory.recurrent:
            return False  # (a recurrent state is shared only whole: the reader will have moved on)
        head = request.prompt_tokens[:HEAD]
        for r in self.running if reading is None else reading:
            if (r.pool is not pool or r.output_tokens or r.num_computed_tokens >= r.num_prompt_tokens
                    or r.prompt_tokens[:HEAD] != head):
                continue
            shared = self._reusable(request, r, common_prefix(_prompt_array(r), _prompt_array(request)))
            if shared >= self.min_reuse and shared > r.num_computed_tokens + self.min_reuse:
                return True
        return False

    def _best_live(self, request: Request, pool: Pool, tokens: np.ndarray, limit: int) -> tuple[Request | None, int]:
        """The running sequence of `pool` whose computed prompt shares the longest prefix with
        `tokens` (at most `limit`), where it may be resumed."""
        head = tokens[:HEAD].tolist()
        best, length = None, 0
        for r in self.running:
            if r.pool is not pool or r.num_computed_tokens <= length or r.prompt_tokens[:HEAD] != head:
                continue
            n = self._reusable(request, r, min(common_prefix(_prompt_array(r), tokens), r.num_computed_tokens, limit))
            if n > length and self._resumable(pool, r.seq_id, n):
                best, length = r, n
        return best, length

    def _resumable(self, pool: Pool, seq_id: int, n: int) -> bool:
        """Whether a sequence may be resumed at `n` (`prefix.Memory`), as llama.cpp will hold it once
        this plan's cache operations ran: one they change is not asked about."""
        if self.memory.cut_anywhere:
            return True
        if (pool, seq_id) in self._copied:
            return False
        cut = self._cut.get((pool, seq_id))  # a recurrent state cut short is dropped whole (runner)
        if cut is not None and self.memory.recurrent and not self.memory.resumable(pool, seq_id, cut):
            return False
        return self.memory.resumable(pool, seq_id, n)

    def _copy_room(self, pool: Pool, source: Entry) -> bool:
        """A sequence id for a copy is free, or held by an entry other than its source."""
        return bool(self.kv[pool].free_seq_ids) or len(self.cache[pool]) > 1

    def _make_room(self, pool: Pool, num_cells: int, *, need_seq: bool, keep: int | None = None) -> None:
        """Evict least recently used entries until a sequence id (if needed) and `num_cells` are free."""
        kv = self.kv[pool]
        while (need_seq and not kv.free_seq_ids) or kv.num_free_cells < num_cells:
            if not self._evict_oldest(pool, keep):
                return

    def _evict_oldest(self, pool: Pool, keep: int | None = None) -> bool:
        """Let the least recently used entry go (`_let_go`): cells were freed."""
        entry = self.cache[pool].oldest(keep) if pool in self.cache else None
        if entry is None:
            return False
        self._let_go(pool, entry)
        return True

    def _let_go(self, pool: Pool, entry: Entry, worth: Callable[[int, int], bool] | None = None) -> None:
        """Evict an entry, or, when it is the pool's last holder of its proxy's preamble and holds
        more, cut it to the preamble: recent as the proxy's last request in the pool, the proxy's
        to reuse. `worth(work, length)`: whether a preamble of `length` cells last used at `work`
        is worth keeping (`expire`'s rule; None: it is, recency decides)."""
        cache = self.cache[pool]
        keep = entry.client_len
        if (not entry.group or entry.preamble_only or keep <= entry.public_len or keep < self.min_reuse
                or not self._resumable(pool, entry.seq_id, keep) or self._holds_preamble(pool, entry)):
            self._evict(pool, entry)
            return
        use, work = max((entry.last_use, entry.work_at_use), cache.group_use.get(entry.group, (0, 0)))
        if worth is not None and not worth(work, keep):
            self._evict(pool, entry)
            return
        self.kv[pool].trim(entry.seq_id, keep)
        cache.trim(entry.seq_id, keep)
        entry.last_use, entry.work_at_use = use, work
        self._op(pool, Drop(entry.seq_id, keep))

    def _holds_preamble(self, pool: Pool, entry: Entry) -> bool:
        """Another entry or a running sequence of the pool holds `entry`'s proxy preamble."""
        keep, head = entry.client_len, entry.tokens[:entry.client_len]
        for other in self.cache[pool].entries.values():
            if (other is not entry and other.group == entry.group and len(other.tokens) >= keep
                    and common_prefix(other.tokens, head) >= keep):
                return True
        for r in self.running:
            if (r.pool is pool and r.group == entry.group and r.num_computed_tokens >= keep
                    and common_prefix(_prompt_array(r), head) >= keep):
                return True
        return False

    def _evict(self, pool: Pool, entry: Entry) -> None:
        self.cache[pool].remove(entry.seq_id)
        self.kv[pool].evict(entry.seq_id)
        self._op(pool, Drop(entry.seq_id))

    def _cap(self, pool: Pool, newest: int) -> None:
        """Keep the pool's entries within `max_cells`: older ones go first, then the newest is trimmed."""
        cap = self.settings.max_cells
        if not cap:
            return
        while self.kv[pool].num_cached_cells > cap and self._evict_oldest(pool, keep=newest):
            pass
        if self.kv[pool].num_cached_cells > cap:
            if cap < self.min_reuse or self.memory.recurrent:  # (a recurrent state cannot be cut)
                self._evict_oldest(pool)
                return
            self.kv[pool].trim(newest, cap)
            self.cache[pool].trim(newest, cap)
            self._op(pool, Drop(newest, cap))


def _prompt_array(request: Request) -> np.ndarray:
    """A request's prompt as a token array, made once (a prompt never changes)."""
    if request.prompt_array is None:
        request.prompt_array = np.asarray(request.prompt_tokens, dtype=np.int32)
    return request.prompt_array
