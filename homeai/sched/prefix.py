"""Cached prefixes: what a pool keeps of finished sequences, and the longest match for a prompt.

When a generating request ends (finished, aborted or preempted), its pool may keep its cells
as an entry: the exact token ids they hold, position by position, under the sequence id that
holds them. A request admitted later whose tokens begin the same way takes the entry over
(or shares its first cells, `llama_memory_seq_cp`) and computes only the rest.

Whose cells a request may reuse (vLLM's `cache_salt`, set here from the member the server
authenticated, never by a client): an entry remembers the member whose request made it and
how many of its leading tokens no member wrote (`public_len`: the template's own default
system prompt, a lane's configured prompt). A request reuses all it matches of its own
member's entries, and of another member's only the leading tokens public to both (`reusable`);
otherwise one member could tell, from `cached_tokens` or the time to a first token, what
another member sent. `PromptCache.shared` (the config's `scheduler.prompt_cache_shared`)
lifts the rule: every member then reuses every member's prefixes.

One level lies between (issue 54): the users of a trusted proxy member (Open WebUI naming each
person; their keys `owui/<user>`) are members here, each with its own cells, and their requests
carry the proxy (`group`, set by the server from the member's proxy flag, never parsed from a
key) and how many leading tokens the client wrote before any user did (`client_len` >=
`public_len`: its tool definitions, and its system text where the config says the client wrote
it: `homeai.service.clients.client_preamble`). Two users of one proxy reuse each other's cells up
to the shorter `client_len`: the client's preamble (Open WebUI's 36 tools, 6.6k tokens) is read
once for all of them, and from the first token a user wrote on, the cache stays that user's.
Between different members it stays `public_len`.

Where a sequence may be resumed (`Memory`, `resumable`): a cell's keys and values are exact for
every later token only while the cells before it that the token attends to are still there.
With plain attention llama.cpp keeps every cell a sequence was given, so any prefix may be cut
and resumed. Sliding-window attention (Gemma 2 and 3, gpt-oss, Cohere 2: `llama_model_n_swa`)
lets llama.cpp give a sequence's cells that fell out of its window to other tokens, whatever
the cache's size (a full-size SWA cache only gives them later): a token at position n reads
positions n-window+1 .. n-1, so a sequence may be resumed at n only while it still holds them
(llama.cpp keeps every position between a sequence's lowest and highest, so its lowest says
it). A recurrent state (Mamba, hybrid models) cannot be cut at all: it is resumed only where it
ends. The facts come from llama.cpp through the runner (`Memory.held`); the rule is here.

Why a scan and not a radix tree (SGLang) or hashed blocks (vLLM): every entry holds a
sequence id of its cache, so a pool has at most `n_seq_max` entries (32 by default), each
one whole sequence. Comparing a prompt with a few dozen token arrays is one vectorised
comparison each, after a cheap check of their first tokens; a tree pays off with thousands
of block-sized fragments, which a cache of a few dozen sequence ids never has.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

HEAD = 8  # a prompt and an entry whose first HEAD tokens differ are not compared further


@dataclass(frozen=True)
class Memory:
    """What a model's cache lets a sequence be resumed from (see the module's docstring)."""

    window: int = 0  # sliding-window attention's span (llama_model_n_swa); 0: every layer sees every cell
    recurrent: bool = False  # a recurrent state (llama_model_is_recurrent / _is_hybrid): never cut
    # The positions [first, end) a sequence of a pool still holds (llama_memory_seq_pos_min and
    # _max); (0, 0): none. None: every cell it was given (a plain cache, or no model: simulations).
    held: Callable[[object, int], tuple[int, int]] | None = None

    @property
    def cut_anywhere(self) -> bool:
        """Every prefix of every sequence may be resumed: nothing to ask."""
        return not self.window and not self.recurrent

    def resumable(self, pool, seq_id: int, n: int) -> bool:
        """Whether sequence `seq_id` of `pool` may be resumed at position `n` (its first `n` cells kept)."""
        if self.cut_anywhere or self.held is None:
            return True
        first, end = self.held(pool, seq_id)
        return resumable(n, first, end, window=self.window, recurrent=self.recurrent)


def resumable(n: int, first: int, end: int, *, window: int, recurrent: bool) -> bool:
    """Whether a sequence holding positions [first, end) may be resumed at position `n` exactly:
    a recurrent state only where it ends; with a sliding window, while it holds the window's
    positions before `n` (n-window+1 .. n-1); otherwise while it holds every position before `n`."""
    if n <= 0 or end < n:
        return n <= 0
    if recurrent:
        return n == end
    return first <= (max(0, n - window + 1) if window else 0)


@dataclass
class Entry:
    seq_id: int
    tokens: np.ndarray  # the token ids its cells hold, one per position
    last_use: int  # the cache's clock when it was added or last matched
    work_at_use: int = 0  # the pool's tokens computed, then
    member: str = ""  # whose request made it
    public_len: int = 0  # its leading tokens no member wrote: the part other members may reuse
    group: str = ""  # the trusted proxy its request came through ("": none)
    client_len: int = 0  # its leading tokens no user wrote: the part the group's other users may reuse

    @property
    def preamble_only(self) -> bool:
        """It holds text its proxy's client wrote and nothing a user did (`KVPools` cuts to that)."""
        return bool(self.group) and self.public_len < self.client_len and len(self.tokens) <= self.client_len

    @property
    def head(self) -> tuple[int, ...]:
        return tuple(self.tokens[:HEAD].tolist())


def reusable(n: int, *, same_member: bool, maker_public: int, public_len: int, same_group: bool = False,
             maker_client: int = 0, client_len: int = 0) -> int:
    """How much of an `n`-token match with cells another request made a request may reuse: all
    of it when one member made both; when two users of one proxy did (`same_group`), the leading
    tokens their client wrote for both; else only the leading tokens public to both."""
    public = min(maker_public, public_len)
    if same_member:
        return n
    return min(n, max(min(maker_client, client_len), public) if same_group else public)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two token arrays share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """One pool's cached prefixes, least recently used first out."""

    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        self._heads: dict[int, tuple[int, ...]] = {}
        self._readers: Counter | None = None  # `readers()`, until an entry comes or goes
        self._clock = itertools.count()
        self.work = 0  # tokens computed in this pool so far: what an entry's keep is paid in
        # Per proxy, when one of its users' requests last came into or left this pool: (clock, work)
        self.group_use: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def num_cells(self) -> int:
        return sum(len(e.tokens) for e in self.entries.values())

    def add(self, seq_id: int, tokens: np.ndarray, member: str, public_len: int, group: str = "",
            client_len: int = 0) -> None:
        public_len = min(public_len, len(tokens))
        entry = Entry(seq_id, tokens, next(self._clock), self.work, member, public_len, group,
                      max(public_len, min(client_len, len(tokens))) if group else public_len)
        self.entries[seq_id] = entry
        self._heads[seq_id] = entry.head
        self._readers = None
        self.seen(group)

    def seen(self, group: str) -> None:
        """A request of `group`'s users came in or left: an entry holding only its preamble is as
        recent as that (`KVPools._let_go`)."""
        if not group:
            return
        use = self.group_use[group] = next(self._clock), self.work
        for entry in self.entries.values():
            if entry.group == group and entry.preamble_only:
                entry.last_use, entry.work_at_use = use

    def best(self, tokens: np.ndarray, member: str, public_len: int, shared: bool, *, limit: int | None = None,
             resumable: Callable[[int, int], bool] | None = None, group: str = "",
             client_len: int = 0) -> tuple[Entry | None, int]:
        """The entry whose reusable prefix with `tokens` (a prompt of `member`, its first
        `public_len` tokens public, its first `client_len` its proxy `group`'s) is longest, at most
        `limit`, and how long; `shared`: any member's, whole. `resumable(seq_id, n)`: whether an
        entry's cells may be resumed at `n` (a sliding window's or a recurrent state's, `Memory`);
        one that may not is passed over."""
        head = tuple(tokens[:HEAD].tolist())
        best, length = None, 0
        for seq_id, entry in self.entries.items():
            if self._heads[seq_id] != head:  # they share fewer than HEAD tokens: not worth reusing
                continue
            n = reusable(common_prefix(entry.tokens, tokens), same_member=shared or entry.member == member,
                         maker_public=entry.public_len, public_len=public_len,
                         same_group=bool(group) and entry.group == group, maker_client=entry.client_len,
                         client_len=client_len)
            n = n if limit is None else min(n, limit)
            if n < length or (n == length and (best is None or entry.last_use <= best.last_use)):
                continue
            if resumable is None or resumable(seq_id, n):
                best, length = entry, n
        return best, length

    def touch(self, entry: Entry) -> None:
        entry.last_use, entry.work_at_use = next(self._clock), self.work

    def readers(self) -> Counter:
        """Entries per reader who may use them again (`reader`; asked each step: counted again
        only when an entry comes or goes)."""
        if self._readers is None:
            self._readers = Counter(reader(e) for e in self.entries.values())
        return self._readers

    def remove(self, seq_id: int) -> Entry:
        self._heads.pop(seq_id)
        self._readers = None
        return self.entries.pop(seq_id)

    def trim(self, seq_id: int, num_cells: int) -> None:
        entry = self.entries[seq_id]
        entry.tokens = entry.tokens[:num_cells]
        entry.public_len = min(entry.public_len, num_cells)
        entry.client_len = min(entry.client_len, num_cells)
        self._heads[seq_id] = entry.head
        self._readers = None

    def oldest(self, keep: int | None = None) -> Entry | None:
        """The least recently used entry (other than `keep`)."""
        others = [e for e in self.entries.values() if e.seq_id != keep]
        return min(others, key=lambda e: e.last_use) if others else None


def reader(entry: Entry) -> str | tuple[str, str]:
    """Who reuses an entry: the member whose request made it, or for an entry holding only its
    proxy's preamble, any of that proxy's users: the group (a tuple, no member's name)."""
    return ("group", entry.group) if entry.preamble_only else entry.member
