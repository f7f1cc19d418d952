"""The cache layout: one KV cache for every lane, or a second one of their own for the interactive lanes.

Chosen once, from `SchedulerLimits.interactive_cells` (`cache_layout`), and asked by every
rule that differs between the two; nothing else branches on it. It sits below the rules that
ask it (admission, placement, background's share): what it asks of them is typed here (`Owed`,
`Filler`), not imported.

* `OneCache`: every sequence in one cache, so one decode call a step. A step fills interactive
  prefill first.
* `TwoCaches`: the interactive lanes' sequences in a cache of their own: a chat's tokens never
  attend over a long document's cells, but background tokens cost a decode call of their own.
  So its decodes wait while an interactive prompt is read unless it is owed a step of them, each
  call of its own beside interactive work is paid for in tokens' worth, and its owed chunk goes
  first in a step. An interactive request may also be read in the main cache (`pools_for`), at
  its lane's priority: a prompt too long for its own cache always is, and any other is when its
  own cache has no room for it at admission, or its longest reusable prefix is in the main one
  (`Admission.place`).

Wherever an interactive request's cells are in the main cache (each one's with `OneCache`, one
placed there with `TwoCaches`), background there gives way to it down to its floor
(`share.py`), and its admission leaves the sequence ids background keeps (`admission.py`): those
rules follow a request's pool, not the layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from homeai.sched.costmodel import StepShape
from homeai.sched.kv import KVManager
from homeai.sched.pools import Pool
from homeai.sched.request import Request

if TYPE_CHECKING:
    from homeai.sched.plan import StepPlan
    from homeai.sched.step import Step


class Owed(Protocol):
    """What a layout asks of background's share (`share.BackgroundShare`)."""

    def decodes_wait(self, num_background: int, call_tokens: float) -> bool: ...
    def first_chunk(self, reserve: int, room: int) -> int: ...
    def share_tokens(self) -> int: ...


class Filler(Protocol):
    """What a layout asks of placement (`placement.Placement`) to fill a step."""

    share: Owed

    def fill(self, step: Step, plan: StepPlan, *, interactive: bool, budget: int) -> int: ...
    def first_token_room(self, step: Step, plan: StepPlan, left: int) -> int: ...
    def shape(self, step: Step, plan: StepPlan) -> StepShape: ...


class CacheLayout(Protocol):
    interactive_pool: Pool  # where the interactive lanes' sequences live

    def caches(self, num_cells: int, num_seqs: int) -> dict[Pool, KVManager]:
        """The generating caches: `num_cells` and `num_seqs` are the main one's."""
        ...

    def pools_for(self, interactive: bool) -> tuple[Pool, ...]:
        """The caches a request of a class may live in, its own first (`Scheduler.pools_for` keeps
        those that hold a request; admission picks one with room: `Admission.place`)."""
        ...

    def prompt_fits(self, request: Request, room: Callable[[Request], bool]) -> bool:
        """An interactive prompt may be read now as far as holding background back goes (`room`:
        admission's, its cells free or background in its cache giving way)."""
        ...

    def background_cells(self, requests: list[Request]) -> int:
        """The cells background sequences weigh on the readers' decode step with, together."""
        ...

    def readers_shape(self, n: int, cells: int, num_background: int, background_cells: int) -> StepShape:
        """The decode step of `n` readers over `cells` beside `num_background` background decodes."""
        ...

    def background_decodes_wait(self, share: Owed, num_background: int, call_tokens: float) -> bool:
        """Background decodes sit out a step in which an interactive prompt is read or a held output written."""
        ...

    def own_calls(self, num_background: int, num_interactive: int, num_embedding: int) -> int:
        """Decode calls background makes of its own beside interactive work in one step (each paid for)."""
        ...

    def fill(self, placement: Filler, step: Step, plan: StepPlan, left: int, reserve: int) -> None:
        """Place prefill chunks and embedding inputs in the `left` tokens of a step (`reserve` of
        them kept for background when it is owed them)."""
        ...


class OneCache:
    interactive_pool = Pool.MAIN

    def caches(self, num_cells: int, num_seqs: int) -> dict[Pool, KVManager]:
        return {Pool.MAIN: KVManager(num_cells, num_seqs)}

    def pools_for(self, interactive: bool) -> tuple[Pool, ...]:
        return (Pool.MAIN,)

    def prompt_fits(self, request: Request, room: Callable[[Request], bool]) -> bool:
        return True  # it may take background's cells; background decodes ride its decode call anyway

    def background_cells(self, requests: list[Request]) -> int:
        return sum([len(r.prompt_tokens) + len(r.output_tokens) for r in requests])  # in the readers' cache, all they will hold

    def readers_shape(self, n: int, cells: int, num_background: int, background_cells: int) -> StepShape:
        n, cells = n + num_background, cells + background_cells
        return StepShape(1, n, n * cells / 1000.0, n)

    def background_decodes_wait(self, share: Owed, num_background: int, call_tokens: float) -> bool:
        return False  # they ride the readers' decode call

    def own_calls(self, num_background: int, num_interactive: int, num_embedding: int) -> int:
        return 0

    def fill(self, placement: Filler, step: Step, plan: StepPlan, left: int, reserve: int) -> None:
        """Interactive prefill first, leaving background's reserve; background takes the rest (within
        what a first interactive token allows it); interactive work takes what background left."""
        used = placement.fill(step, plan, interactive=True, budget=left - reserve)
        room = placement.first_token_room(step, plan, left - used)
        used += placement.fill(step, plan, interactive=False, budget=max(room, reserve))
        if reserve and used < left:  # background left part of its reserve: interactive work takes it
            placement.fill(step, plan, interactive=True, budget=left - used)


class TwoCaches:
    interactive_pool = Pool.INTERACTIVE

    def __init__(self, interactive_cells: int):
        self.interactive_cells = interactive_cells

    def caches(self, num_cells: int, num_seqs: int) -> dict[Pool, KVManager]:
        return {Pool.MAIN: KVManager(num_cells, num_seqs),
                Pool.INTERACTIVE: KVManager(self.interactive_cells, num_seqs)}

    def pools_for(self, interactive: bool) -> tuple[Pool, ...]:
        # Background stays in the main cache: in the interactive one its decodes would slow the readers'.
        return (Pool.INTERACTIVE, Pool.MAIN) if interactive else (Pool.MAIN,)

    def prompt_fits(self, request: Request, room: Callable[[Request], bool]) -> bool:
        return room(request)  # background decodes wait for it: only for a prompt that will be read

    def background_cells(self, requests: list[Request]) -> int:
        return sum([r.num_computed_tokens for r in requests])  # in a cache of their own: what their decode call attends over

    def readers_shape(self, n: int, cells: int, num_background: int, background_cells: int) -> StepShape:
        shape = StepShape(1, n, n * cells / 1000.0, n)
        if num_background:  # background decodes in their own cache, with a decode call of their own
            m = num_background
            shape = shape.plus(StepShape(1, m, m * background_cells / 1000.0, m))
        return shape

    def background_decodes_wait(self, share: Owed, num_background: int, call_tokens: float) -> bool:
        return share.decodes_wait(num_background, call_tokens)

    def own_calls(self, num_background: int, num_interactive: int, num_embedding: int) -> int:
        return (num_background > 0) + (num_embedding > 0) if num_interactive else 0

    def fill(self, placement: Filler, step: Step, plan: StepPlan, left: int, reserve: int) -> None:
        """Background tokens cost a decode call of their own (and attend over long documents), so
        background's owed chunk goes first (`BackgroundShare.first_chunk`); interactive prefill
        takes what the aim leaves beside it, and background fills whatever is left after that."""
        used = 0
        chunk = placement.share.first_chunk(reserve, self._room(placement, step, plan, left)) if reserve else 0
        if chunk:
            used = placement.fill(step, plan, interactive=False, budget=chunk)
        budget = left - used
        if used:  # what the interactive lanes may still add within the aim, beside that chunk
            budget = min(budget, step.cost.tokens_within(step.aim, placement.shape(step, plan),
                                                         step.cells[Pool.INTERACTIVE],
                                                         new_decode=not plan.batches[Pool.INTERACTIVE]))
        used += placement.fill(step, plan, interactive=True, budget=budget)
        room = self._room(placement, step, plan, left - used)
        placement.fill(step, plan, interactive=False, budget=placement.first_token_room(step, plan, room))

    def _room(self, placement: Filler, step: Step, plan: StepPlan, left: int) -> int:
        """Background's part of what is left of the step, costed in its own cache: its tokens cost
        more (long documents, maybe a decode call of its own) than the ones the budget assumed."""
        fits = step.cost.tokens_within(step.aim, placement.shape(step, plan), step.cells[Pool.MAIN],
                                       new_decode=not plan.batches[Pool.MAIN])
        if step.overdue:
            fits = max(fits, placement.share.share_tokens())
        elif not plan.batches[Pool.INTERACTIVE]:  # no interactive token to keep on time: the step's floor
            fits = max(fits, step.min_chunk)
        return min(left, fits)


def cache_layout(interactive_cells: int) -> CacheLayout:
    """The layout `interactive_cells` asks for (0: one cache for every lane)."""
    return TwoCaches(interactive_cells) if interactive_cells else OneCache()
