"""Background's minimum share: the one owner of what background work is owed under interactive load.

While background work is backlogged it is owed `background_min_share` of every step's tokens
(a deficit counter, `credit`, paid with the tokens it gets; beside interactive work in a cache
of their own, each background decode call is paid too, its fixed cost in tokens' worth). A
step's debt and payment are planned with it (`due`) and settled only once it ran (`settle`,
from `Scheduler.update`): a step that found no KV slot or failed owes and pays nothing. The
debt is paid through:

* the reserve: tokens of a step kept for background prefill or embedding, once the debt is a
  chunk's worth and background can use them this step;
* decode deferral: with a cache of their own, interactive lanes take whole steps while one of
  them reads a prompt, and background decodes (a second decode call each) wait until the debt
  covers a step of them;
* the floors: background keeps `background_min_share` of the sequence ids while it waits for
  one, and is not preempted for interactive work below that share of ids and cells;
* the way back: a background lane whose oldest request has waited half its TTFT target gets a
  step's minimum share whatever the cost model predicts: the model learns only from steps that
  run, so a fit a noisy neighbour made too slow must not stop the steps that would correct it.
  (Interactive lanes need no way back: a reader's decode runs every step, and with no reader
  running a prompt is always let in.)
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from homeai.sched.plan import BackgroundDue, StepPlan
from homeai.sched.pools import KVPools, Pool
from homeai.sched.request import Kind, Request
from lanes.base import LanePolicy

NOT_LATE: frozenset[str] = frozenset()  # no background lane is overdue (most steps)

# The layout's: decode calls background makes of its own beside interactive work, from the step's
# background, interactive and embedding items.
OwnCalls = Callable[[int, int, int], int]


class BackgroundShare:
    def __init__(self, policies: dict[str, LanePolicy], pools: KVPools, *, min_share: float, min_chunk: int,
                 max_step_tokens: int, num_seqs: int, num_cells: int, max_credit: int):
        self.policies, self.pools = policies, pools
        self.min_share, self.min_chunk, self.max_step_tokens = min_share, min_chunk, max_step_tokens
        self.num_seqs, self.num_cells, self.max_credit = num_seqs, num_cells, max_credit
        self.credit = 0.0  # background tokens owed under interactive load
        # The last step held background back for an interactive first token: the next one does not
        # (`Placement.first_token_room`), so background waits at most one step running for them.
        self.waited_for_first = False
        self._background: tuple[int, list[Request]] = (-1, [])  # `_held`'s, and the pools' version then

    # ---- the way back ----------------------------------------------------------------

    def overdue(self, reading: list[Request], waiting: dict[str, deque[Request]], now: float) -> frozenset[str]:
        """Background lanes whose oldest request has waited half its lane's TTFT target for its
        first token (or embedding): served from then on, it still makes the target (`reading`:
        the requests in flight still reading their input)."""
        late = {r.lane for r in reading if r.first_token_time is None and self._late(r, now)} if reading else set()
        for lane, queue in waiting.items():
            if queue and self._late(queue[0], now):
                late.add(lane)
        return frozenset(lane for lane in late if not self.policies[lane].interactive) if late else NOT_LATE

    def _late(self, request: Request, now: float) -> bool:
        return now - request.arrival_time > self.policies[request.lane].ttft_target_ms / 2000.0

    def share_tokens(self) -> int:
        """A step's minimum share, in tokens: what an overdue lane gets whatever the cost model says."""
        return max(self.min_chunk, math.ceil(self.min_share * self.max_step_tokens))

    def way_back(self, overdue: frozenset[str]) -> int:
        """Tokens a step carries beyond its decodes whatever the cost model predicts: a minimum
        share while a background lane is overdue, and a chunk once background is owed one."""
        owed = self.min_chunk if self.credit >= self.min_chunk else 0
        return max(self.share_tokens() if overdue else 0, owed)

    # ---- the debt and how it is paid -----------------------------------------------------

    def decodes_wait(self, num_background: int, call_tokens: float) -> bool:
        """Background decodes wait for an interactive prompt unless the debt covers a step of them."""
        return num_background > 0 and self.credit < num_background + call_tokens

    def reserve(self, usable: int | None, left: int, min_chunk: int) -> int:
        """Tokens of this step kept for background work, if it can use them this step."""
        if not usable or self.credit < min_chunk:
            return 0
        return max(min(int(self.credit), left, usable), 0)

    def first_chunk(self, reserve: int, room: int) -> int:
        """With a cache of their own for interactive lanes, the owed chunk background goes first
        with (whatever the model says), and only once the debt covers it: paying a token or two
        every step would pay background's decode call every step. 0: not this step."""
        fits = max(room, min(reserve, self.min_chunk))
        return min(reserve, fits) if fits and self.credit >= min(fits, self.min_chunk) else 0

    def atomic_may_overflow(self, n: int, lane: str, overdue: frozenset[str]) -> bool:
        """An atomic embedding input larger than what is left of a step may overflow it once the
        debt covers it or its lane (embeddings, indexing) is overdue."""
        return n <= self.credit or lane in overdue

    def due(self, plan: StepPlan, interactive: set[str], *, call_tokens: float, own_calls: OwnCalls) -> BackgroundDue:
        """What a step owes background while it is backlogged: `min_share` of the step's tokens;
        and what it pays: the tokens background got and, for each decode call of its own beside
        interactive work (`own_calls`, the layout's; `interactive`: the ids of interactive
        requests), the call's fixed cost in tokens' worth. Settled only if the step runs (`settle`)."""
        generating, embedding = plan.generating, plan.batches[Pool.EMBED]
        background = [i for i in generating if i.request_id not in interactive]
        got = sum(len(i.tokens) for i in background) + sum(len(i.tokens) for i in embedding)
        calls = own_calls(len(background), len(generating) - len(background), len(embedding))
        if calls:
            got += call_tokens * calls
        return BackgroundDue(self.min_share * plan.num_tokens, got)

    def settle(self, due: BackgroundDue) -> None:
        """A step ran: its debt to background is added to the credit and its payment taken off."""
        self.credit = min(max(self.credit + due.owed - due.got, 0.0), self.max_credit)

    def forget(self) -> None:
        """Nothing background is backlogged: it is owed nothing."""
        self.credit = 0.0

    # ---- the floors ------------------------------------------------------------------

    def _held(self) -> list[Request]:
        """Background sequences running (asked per admission and per preemption: listed again only
        when the running set changed)."""
        if self._background[0] != self.pools.version:
            self._background = self.pools.version, [r for r in self.pools.running if not r.interactive]
        return self._background[1]

    def _min_seqs(self) -> int:
        """The sequence ids background keeps at least."""
        return min(math.ceil(self.min_share * self.num_seqs), self.num_seqs - 1)

    def seq_reserve(self, waiting: dict[str, deque[Request]]) -> int:
        """Sequence ids of the shared cache kept free for background waiting below its minimum share."""
        if self.pools.num_free_seqs(Pool.MAIN) > self.num_seqs * self.min_share + 1:
            return 0  # more free than any reserve could ask: skip the scan
        if not any(r.kind is Kind.GENERATE for lane, q in waiting.items() if not self.policies[lane].interactive
                   for r in q):
            return 0
        return max(self._min_seqs() - len(self._held()), 0)

    def may_preempt(self) -> bool:
        """Background may give up a sequence for interactive work: it holds more than its share
        of the sequence ids, or of the cells (counted only when the ids do not settle it)."""
        held = self._held()
        if len(held) > self._min_seqs():
            return True
        main = self.pools.kv[Pool.MAIN].allocated
        return sum(main[r.seq_id] for r in held) > int(self.min_share * self.num_cells)
