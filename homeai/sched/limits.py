"""The scheduler's limits and its refusals: `SchedulerLimits` (the generation and embedding
contexts' cells and sequence ids, a step's most tokens, and the knobs each rule reads), and the
requests it will not take (`UnknownLane`, `QueueFull`, `NoRoom`)."""

from __future__ import annotations

from dataclasses import dataclass


class UnknownLane(ValueError):
    """A lane with no policy: the one check that a lane exists (`Scheduler.lane`)."""

    def __init__(self, lane: str, known):
        super().__init__(f"unknown lane {lane!r} (known: {', '.join(known)})")
        self.lane = lane


class QueueFull(Exception):
    """A lane's queue is at its maximum; the caller should retry later (HTTP 429)."""

    def __init__(self, lane: str, max_queue: int):
        super().__init__(f"lane {lane!r} queue is full ({max_queue} waiting); retry later")
        self.lane, self.max_queue = lane, max_queue


class NoRoom(ValueError):
    """A sequence longer than any cache its lane may use holds (the engine refuses it first, saying
    how many tokens fit where: `Scheduler.max_seq_len`)."""

    def __init__(self, lane: str, num_tokens: int):
        super().__init__(f"no cache of lane {lane!r} holds a sequence of {num_tokens} tokens")


@dataclass(frozen=True)
class SchedulerLimits:
    num_cells: int  # KV cells of the generation context
    num_seqs: int  # sequence ids of the generation context
    max_step_tokens: int  # the most tokens one step may carry (llama.cpp's n_batch)
    embed_max_tokens: int  # cells of the embedding context: the most embedding tokens in flight
    embed_max_seqs: int  # sequence ids of the embedding context: the most inputs in flight
    w_in: float = 1.0
    w_out: float = 2.0
    background_min_share: float = 0.1
    min_chunk: int = 16
    max_step_ms: float = 120.0
    embed_chunked: bool = True  # the embedding model keeps a KV cache, so an input may span steps
    # Cells of a second KV cache for the interactive lanes (0: every lane shares the one cache),
    # with num_seqs sequence ids of its own.
    interactive_cells: int = 0
    # A lane's typical output length until its own finished requests teach the scheduler better:
    # admission costs readers at their typical length, not at the length they have now.
    typical_output: int = 64
    # Keep finished sequences' cells as cached prefixes a later request may start from, up to
    # `prompt_cache_max_cells` a pool (0: whatever the live sequences leave free).
    prompt_cache: bool = False
    prompt_cache_max_cells: int = 0
    member_seq_share: float = 0.5  # the most of the interactive readers one member holds while others wait
    prompt_cache_shared: bool = False  # every member reuses every member's prefixes (else: per member, `prefix.py`)
    max_seq_len: int = 0  # the longest sequence the model takes (its training context); 0: any a cache holds
