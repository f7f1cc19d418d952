"""Pacing: how long a step may take, how many tokens it may carry, and how many readers fit.

While interactive lanes decode, a step aims below their inter-token target (`step_aim` of
their pace), and any prefill chunk that fits rides along (however small: the step's fixed cost
is paid anyway). A new reader is let in only while the readers' decodes, each costed at its
lane's typical output length (learnt from finished requests), take at most `readers_aim` of
the pace, so the rest of the aim reads new prompts; past that, one more sequence would slow
every reader below reading pace (and, with attention over every cell, lower throughput too).
With no reader the step grows towards `max_step_ms` for throughput.

On a machine too slow for a lane's target (a large model on a CPU: one reader's decode alone
takes most of it), readers share the steps anyway rather than wait for each other to finish:
the pace is then `shared_pace` times the step one reader takes alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple, Protocol

from homeai.sched.costmodel import StepCostModel, StepShape, predicted_ms, tokens_within
from homeai.sched.request import RUNNING, Request


class ReaderShapes(Protocol):
    """What pacing asks of the cache layout (`layout.py`): how background weighs on the readers."""

    def background_cells(self, requests: list[Request]) -> int: ...
    def readers_shape(self, n: int, cells: int, num_background: int, background_cells: int) -> StepShape: ...


@dataclass(frozen=True)
class PaceTuning:
    # Of the readers' pace, what a step aims at: the cost model's error and the machine's noise
    # land on both sides of it. Lower keeps inter-token targets through noise; higher reads prompts faster.
    step_aim: float = 0.8
    # Of the pace, what the readers' decodes at typical length may take: lower leaves more of
    # each step for reading new prompts; higher lets more readers decode at once.
    readers_aim: float = 0.7
    # On a machine too slow for the target, the pace as a multiple of a lone reader's step:
    # higher lets more readers share the steps, each reading slower.
    shared_pace: float = 2.0
    # With no reader, of `max_step_ms`, what a step aims at: higher is more throughput, less margin.
    background_aim: float = 0.9
    # While an interactive output is held (read whole: a tool call being written), a step aims at
    # most this many times what its decodes alone take: prompts still read, in smaller chunks, and
    # the held output comes near the machine's decode speed instead of at reading pace. A step that
    # gives an interactive request its first token carries background only up to this many times
    # its own cost (every other step at most: background never waits two in a row).
    held_step: float = 1.5
    # While a member with no answer decoding reads a short question's prompt (one that such steps
    # finish in `first_read_steps`), a step may aim up to `first_read` times the readers' pace:
    # beside another member's many readers it would otherwise be read a few tokens a step. The
    # readers see a few longer steps per question; a long prompt is read at the pace.
    first_read: float = 1.5
    first_read_steps: int = 3
    # With nothing decoding at all (a background prompt read alone, say a long document on an idle box,
    # or a member's question one such step reads whole), a step may aim this many times longer: fewer
    # steps pay the step's fixed cost less often, so the prompt is read faster; an arrival meanwhile
    # waits up to one such step. A longer question is read in plain steps (`Planning._finishes_alone`):
    # another member asking meanwhile would wait for the step in flight (about 320 ms against 108 on 2 cores).
    lone_step: float = 3.0
    # How far each finished request moves its lane's typical output length towards its own:
    # higher learns a lane's change faster, and follows its outliers more.
    typical_learning: float = 0.2
    # After llama.cpp finds no KV slot the budget halves, down to this fraction, and doubles back
    # with each step that runs: lower frees more room, at more steps of slow progress.
    min_shrink: float = 1 / 64


class Readers(NamedTuple):
    """The running set as admission costs it."""

    n: int  # interactive sequences running
    priority: int  # the best (lowest) priority among them
    target: float  # the tightest inter-token target among them (ms)
    cells: int  # their cells at their typical length
    background: int  # background sequences decoding
    background_cells: int  # the cells background holds (or will, with one cache for all)


class Pacing:
    def __init__(self, typical: dict[str, float], max_step_ms: float, max_step_tokens: int, min_chunk: int,
                 tuning: PaceTuning = PaceTuning()):
        self.typical = dict(typical)  # per lane, its typical output length (learnt)
        self.max_step_ms, self.max_step_tokens, self.min_chunk = max_step_ms, max_step_tokens, min_chunk
        self.tuning = tuning
        self.shrink = 1.0  # < 1 after llama.cpp found no KV slot
        self._learnt = 0  # typical lengths learnt so far (what `readers` gathered holds until one is)
        self._gathered: tuple[tuple[int, int], tuple] | None = None  # `readers`', and for which running set

    def pace(self, cost: StepCostModel, target_ms: float) -> float:
        """The inter-token time readers are held to: their lane's target, or on a machine too slow
        for it, what lets them share the steps (admission holds them to `readers_aim` of it)."""
        lone = cost.predict_ms(StepShape(1, 1, 0.0, 1))
        return max(target_ms, self.tuning.shared_pace * lone / self.tuning.readers_aim)

    def aim(self, pace: float | None, lone: bool = False) -> float:
        """A step's time target (ms): below the readers' pace, or near `max_step_ms` without readers
        (`lone_step` times that with nothing decoding at all)."""
        if pace is not None:
            return self.tuning.step_aim * pace
        return self.tuning.background_aim * self.max_step_ms * (self.tuning.lone_step if lone else 1.0)

    def held_aim(self, aim: float, cost: StepCostModel, decodes: StepShape) -> float:
        """A step's aim while an interactive output is held: `held_step` times its decodes' cost."""
        return min(aim, self.tuning.held_step * cost.predict_ms(decodes))

    def first_read_aim(self, aim: float, pace: float | None, cost: StepCostModel, decodes: StepShape,
                       cells: int, shortest: int | None) -> float:
        """A step's aim while members' first questions are read (`shortest`: the fewest tokens left
        of one; None: none is): what finishes the shortest, within `first_read` times the pace, if
        it is short; never below `aim`."""
        if pace is None or shortest is None:
            return aim
        n, longest = shortest, self.tuning.first_read * pace
        if n > self.tuning.first_read_steps * cost.tokens_within(longest, decodes, cells, new_decode=False):
            return aim
        need = cost.predict_ms(decodes.plus(StepShape(0, n, n * cells / 1000.0, 1)))
        return max(aim, min(need, longest))

    def min_chunk_for(self, pace: float | None) -> int:
        """The smallest prefill chunk worth placing: any, while readers pay the step's fixed cost anyway."""
        return 1 if pace is not None else self.min_chunk

    def budget(self, cost: StepCostModel, num_decoding: int, decodes: StepShape, pace: float | None, aim: float,
               cells: int, new_decode: bool, prompt: bool, way_back: int) -> Callable[[], int]:
        """Tokens a step may carry: its decodes and what the cost model fits in `aim` over
        `cells` (the cache a prompt would be read in), never less than a floor: a prompt that was
        let in is read by a token a step while decoding alone stays within the pace (admission left
        room for it); without readers a minimum chunk; and `way_back` whatever the model says.
        Returned as the sum to do, over the model and the shrink as they stand now: a step with
        nothing waiting never asks it (`StepPlan.budget`)."""
        return partial(self._budget, cost.coefficients, self.shrink, num_decoding, decodes, pace, aim, cells,
                       new_decode, prompt, way_back)

    def _budget(self, coefficients: tuple[float, ...], shrink: float, num_decoding: int, decodes: StepShape,
                pace: float | None, aim: float, cells: int, new_decode: bool, prompt: bool, way_back: int) -> int:
        tokens = num_decoding + tokens_within(coefficients, aim, decodes, cells, new_decode)
        if pace is not None:
            floor = num_decoding + (1 if prompt and predicted_ms(coefficients, decodes) < pace else 0)
        else:
            floor = num_decoding + self.min_chunk
        budget = max(min(tokens, self.max_step_tokens), floor, num_decoding + way_back)
        return min(max(int(budget * shrink), num_decoding + 1), self.max_step_tokens)

    def readers(self, running: list[Request], version: int, targets: dict[str, float], layout: ReaderShapes) -> Readers:
        """The running set as admission costs it (asked each step a prompt waits). What changes only
        with the running set (`version`) or a lane's typical length is gathered once for them: the
        readers, each one's cells at its typical length (or its own cap), their best priority and
        tightest target, the background sequences. Each step then adds up what grows: a reader past
        its typical length holds its length, and background's decoding and cells."""
        key = (version, self._learnt)
        if self._gathered is None or self._gathered[0] != key:
            self._gathered = key, self._gather(running, targets)
        n, priority, target, sized, background = self._gathered[1]
        cells = 0
        for r, num_prompt, at in sized:
            now = num_prompt + len(r.output_tokens)
            cells += now if now >= at else at
        # `r.is_decoding`, inlined (running sequences)
        decoding = len([r for r in background if r.output_tokens and r.status is RUNNING
                        and len(r.prompt_tokens) + len(r.output_tokens) - r.num_computed_tokens == 1])
        return Readers(n, priority, target, cells, decoding, layout.background_cells(background))

    def _gather(self, running: list[Request], targets: dict[str, float]) -> tuple:
        """`readers`' part fixed while the running set and the typical lengths hold."""
        priority: int | None = None
        target = math.inf
        sized: list[tuple[Request, int, int]] = []  # per reader: its prompt's length, its cells at its typical length
        background: list[Request] = []
        for r in running:
            if not r.interactive:
                background.append(r)
                continue
            if priority is None or r.priority < priority:
                priority = r.priority
            if targets[r.lane] < target:
                target = targets[r.lane]
            num_prompt, typical, cap = len(r.prompt_tokens), self.typical[r.lane], r.max_tokens
            sized.append((r, num_prompt, int(num_prompt + (cap if cap < typical else typical))))
        return len(sized), 0 if priority is None else priority, target, sized, background

    def readers_keep_pace(self, cost: StepCostModel, readers: Readers, request: Request, target_ms: float,
                          layout: ReaderShapes) -> bool:
        """Admitting one more interactive sequence keeps the readers' decode step within
        `readers_aim` of the pace once every one of them, the new one too, has its typical length.

        Costing them at their length now would let a burst of young chats in that, as they grow,
        slow every reader past its target (attention runs each token over every cell of its cache)
        and past the batch size where throughput peaks. A lane whose priority beats every running
        reader's (voice among chats) is always let in."""
        if not readers.n or request.priority < readers.priority:
            return True
        pace = self.pace(cost, min(readers.target, target_ms))
        shape = layout.readers_shape(readers.n + 1, readers.cells + self.typical_cells(request),
                                     readers.background, readers.background_cells)
        return cost.predict_ms(shape) <= self.tuning.readers_aim * pace

    def typical_cells(self, request: Request) -> int:
        """The cells a generating sequence holds at its lane's typical output length (or its own cap).
        (Asked of every reader once a step: the counts are read once each.)"""
        num_prompt = len(request.prompt_tokens)
        typical, cap = self.typical[request.lane], request.max_tokens
        at_typical = int(num_prompt + (cap if cap < typical else typical))
        now = num_prompt + len(request.output_tokens)
        return now if now >= at_typical else at_typical

    def learn(self, request: Request) -> None:
        """A request finished on its own: its output length moves its lane's typical length."""
        rate = self.tuning.typical_learning
        self.typical[request.lane] = (1 - rate) * self.typical[request.lane] + rate * len(request.output_tokens)
        self._learnt += 1

    def no_kv_slot(self) -> None:
        self.shrink = max(self.shrink / 2, self.tuning.min_shrink)

    def step_ran(self) -> None:
        self.shrink = min(self.shrink * 2, 1.0)
