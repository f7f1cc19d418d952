"""What crosses between the scheduler and the runner: a step's plan and its result, keyed by request id.

A plan holds, per KV pool, the items of that pool's one `llama_decode` this step; the
sequence ids are the pool's own. Scheduler tests feed hand-made results and need no model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Callable, NamedTuple

from homeai.sched.costmodel import StepShape
from homeai.sched.pools import GENERATE, Copy, Drop, Pool
from homeai.sched.request import Kind, Request, Sample, SamplingParams


POOLS = tuple(Pool)  # every pool, in their order (iterating the enum itself is slow, and a plan is made each step)


class ScheduledItem(NamedTuple):
    """One request's tokens in a step (made for every sequence every step: a named tuple is
    immutable, as a frozen dataclass, and made several times faster)."""

    request_id: str
    kind: Kind
    seq_id: int  # the sequence id within its pool's cache
    start: int  # position of the first token
    tokens: list[int]
    sample: bool  # a token is sampled after this chunk
    params: SamplingParams | None = None  # the runner builds the request's sampler from these
    forced: int | None = None  # teacher forcing: the token to output instead of sampling


# A plan's items are read field by field for every sequence several times a step: by these, in C.
_REQUEST_ID, _TOKENS, _SAMPLE = attrgetter("request_id"), attrgetter("tokens"), attrgetter("sample")


@dataclass(frozen=True)
class BackgroundDue:
    """What background is owed and paid by one step (`share.py`), settled once the step ran."""

    owed: float  # its minimum share of the step's tokens
    got: float  # the tokens it got (and, beside interactive work, its decode calls' worth)


@dataclass
class StepPlan:
    step_id: int
    # Per pool, the items of its one llama_decode this step (in the order they were placed).
    batches: dict[Pool, list[ScheduledItem]] = field(default_factory=lambda: {pool: [] for pool in POOLS})
    # Per pool, cache operations to run in order before the step: drop a sequence's cells (all,
    # or past a position), or share one sequence's first cells with another.
    cache_ops: dict[Pool, list[Drop | Copy]] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)  # requests whose sampler state may go
    # The budget's sum, done when `budget` is first asked (with nothing waiting, no step asks it).
    budget_of: Callable[[], int] | None = None
    _budget: int = 0
    context_cells: int = 0  # KV cells holding context when the step was planned
    shape: StepShape = StepShape(0)  # what the cost model costs: decode calls, tokens, attention, outputs
    # Per request, the tokens drafted after its decode's token (`draft.py`): its item's tokens are
    # that token and these, each row sampled in turn. Empty in most steps.
    drafts: dict[str, list[int]] = field(default_factory=dict)
    num_drafted: int = 0
    # Per request, a draft the runner's draft model is to guess (its prompt, its output so far, the most
    # tokens): the runner adds the guess to its item and to `drafts` (none while it catches up)
    model_drafts: dict[str, tuple[list[int], list[int], int]] = field(default_factory=dict)
    background: BackgroundDue | None = None  # None: background had no work waiting (it is owed nothing)

    @property
    def budget(self) -> int:
        """Tokens the step may carry, decodes included."""
        if self.budget_of is not None:
            self._budget, self.budget_of = self.budget_of(), None
        return self._budget

    @property
    def items(self) -> list[ScheduledItem]:
        """Every item of the step, generating pools first."""
        return [i for pool in (*GENERATE, Pool.EMBED) for i in self.batches[pool]]

    @property
    def generating(self) -> list[ScheduledItem]:
        """The generating pools' items, in the order they are decoded."""
        items: list[ScheduledItem] = []
        for pool in GENERATE:
            items += self.batches[pool]
        return items

    def request_ids(self) -> set[str]:
        """The requests with an item in the plan."""
        return set(map(_REQUEST_ID, chain.from_iterable(self.batches.values())))

    @property
    def num_outputs(self) -> int:
        return sum(1 for i in self.generating if i.sample)

    @property
    def num_tokens(self) -> int:
        return sum(map(len, map(_TOKENS, chain.from_iterable(self.batches.values()))))  # (in C: asked every step)

    @property
    def empty(self) -> bool:
        return not any(self.batches.values())

    def cost_shape(self, cells: dict[Pool, int]) -> StepShape:
        """The cost model's view of the step: one decode call per pool used, each token attending
        over its own pool's `cells` (one pass over the items: it is asked several times a step)."""
        calls = tokens = attention = outputs = 0
        for pool, items in self.batches.items():
            if not items:
                continue
            n = sum(map(len, map(_TOKENS, items)))
            if pool in GENERATE:  # (an embedding input's last chunk samples nothing)
                outputs += sum(map(_SAMPLE, items))
            if n:
                calls, tokens, attention = calls + 1, tokens + n, attention + n * cells[pool]
        # (a drafted token counts as a token, not as an output: a decode's own output and its call
        # always come together, so the fit cannot tell them apart, and a drafted row costs what a token does)
        return StepShape(calls, tokens, attention / 1000.0, outputs)

    @staticmethod
    def decodes_shape(num_decoding: dict[Pool, int], cells: dict[Pool, int]) -> StepShape:
        """`cost_shape` of a plan of decodes alone, `num_decoding` per pool (a token each, each
        sampled), counted without a pass over the items."""
        calls = tokens = attention = 0
        for pool, n in num_decoding.items():
            if n:
                calls, tokens, attention = calls + 1, tokens + n, attention + n * cells[pool]
        return StepShape(calls, tokens, attention / 1000.0, tokens)

    @property
    def idle(self) -> bool:
        """Nothing to run and nothing to drop: the loop may wait."""
        return not any(self.batches.values()) and not self.cache_ops and not self.done  # (`empty`, asked every step)


@dataclass
class StepResult:
    samples: dict[str, Sample] = field(default_factory=dict)
    embeddings: dict[str, object] = field(default_factory=dict)
    elapsed_ms: float = 0.0
    no_kv_slot: bool = False  # llama_decode found no KV slot: nothing of this step was kept
    # Per request that drafted (`StepPlan.drafts`), its drafted tokens its sampling picked, in order,
    # before the one in `samples` (which differed from the next guess, or followed the last)
    accepted: dict[str, list[Sample]] = field(default_factory=dict)
    # Requests the runner ended with an error of their own, and why (a grammar past its step budget):
    # each has an end-of-generation sample, and the engine ends it as a failed step ends its requests
    errors: dict[str, str] = field(default_factory=dict)


class Output(NamedTuple):
    """What a step did for one request (a named tuple: one a sequence a step, see `ScheduledItem`)."""

    request: Request
    sample: Sample | None  # the new token, if one was sampled
    finished: bool


# A named tuple's own constructor is a Python function; the tuples made for every sequence every
# step (a decode's item, its output) are made by the C one, from their fields in order (half the cost).
new_tuple = tuple.__new__
