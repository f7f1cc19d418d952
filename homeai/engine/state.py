"""What the box is doing, as typed values: each lane's policy and live state, each KV cache's
use, and the prompt cache's hits (the lane's, and each member's own). The engine builds it
under its lock (`engine_state`); `api/lanes.py` turns it into the `/api/lanes` JSON and `api/prometheus.py` into
gauges, each showing a member who is not an admin only what tells nothing of others' prompts."""

from __future__ import annotations

from dataclasses import dataclass, field

from homeai.sched import costmodel
from lanes.base import LanePolicy


@dataclass(frozen=True)
class Latency:
    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class PromptCacheUse:
    """Since the engine started: prompt tokens of this lane's finished generations, and how many
    of them were found in the prompt cache instead of computed."""

    requests: int = 0
    hits: int = 0  # requests that reused at least one cached token
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """The share of prompt tokens read from the cache."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def plus(self, prompt_tokens: int, cached_tokens: int) -> "PromptCacheUse":
        return PromptCacheUse(self.requests + 1, self.hits + (cached_tokens > 0),
                              self.prompt_tokens + prompt_tokens, self.cached_tokens + cached_tokens)


@dataclass(frozen=True)
class DraftUse:
    """Since the engine started: tokens drafted for this lane's answers and how many were accepted
    (`homeai.sched.draft`), and the draft length chosen last (the longest of its members')."""

    drafted: int = 0
    accepted: int = 0
    length: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def plus(self, drafted: int, accepted: int, length: int) -> "DraftUse":
        return DraftUse(self.drafted + drafted, self.accepted + accepted, max(self.length, length))


@dataclass(frozen=True)
class LaneState:
    policy: LanePolicy
    queued: int
    running: int
    rejected: int  # refused with a full queue, since the engine started
    typical_output_tokens: float  # the answer length admission costs the lane's readers at
    reading_pace_ms: float | None  # the inter-token time its readers are held to (interactive lanes)
    finished: int  # requests finished in the recent window
    ttft_ms: Latency
    itl_ms: Latency
    prompt_cache: PromptCacheUse = field(default_factory=PromptCacheUse)
    member_prompt_cache: dict[str, PromptCacheUse] = field(default_factory=dict)  # each member's own share
    drafting: DraftUse = field(default_factory=DraftUse)
    member_drafting: dict[str, DraftUse] = field(default_factory=dict)  # each member's own

    def prompt_cache_of(self, member: str) -> PromptCacheUse:
        """The figures of `member`'s own finished generations on this lane."""
        return self.member_prompt_cache.get(member, PromptCacheUse())

    def drafting_of(self, member: str) -> DraftUse:
        return self.member_drafting.get(member, DraftUse())


@dataclass(frozen=True)
class CacheState:
    """One KV cache (a pool of the scheduler)."""

    cells_total: int
    cells_used: int  # held by live sequences
    cells_cached: int  # held by cached prefixes: reclaimable
    seqs_total: int
    seqs_used: int  # live sequences
    entries: int  # cached prefixes


@dataclass(frozen=True)
class EngineState:
    lanes: dict[str, LaneState]
    caches: dict[str, CacheState]  # by pool name: "main", and "interactive" when the lanes have their own
    steps: int
    step_cost_ms: dict[str, float]  # the step-cost model's coefficients, by name

    def total(self, key: str) -> int:
        return sum(getattr(c, key) for c in self.caches.values())


def engine_state(engine) -> EngineState:
    """What `engine` is doing (`Engine.state`, under its lock)."""
    sched = engine.scheduler
    running = {name: 0 for name in engine.policies}
    for request in sched.running:
        running[request.lane] += 1
    lanes = {name: _lane_state(engine, name, policy, running[name]) for name, policy in engine.policies.items()}
    caches = {pool.value: CacheState(kv.num_cells, kv.num_used_cells, kv.num_cached_cells,
                                     sched.limits.num_seqs, len(kv.allocated), len(kv.cached))
              for pool in reversed(sched.pools.generating) for kv in [sched.pools.kv[pool]]}
    return EngineState(lanes, caches, engine.counters["steps"], costmodel.named(sched.cost.coefficients))


def _lane_state(engine, name: str, policy: LanePolicy, running: int) -> LaneState:
    sched, recent = engine.scheduler, engine.windows[name].summary()
    return LaneState(policy, sched.num_waiting(name), running, engine.counters["rejected"][name],
                     round(sched.typical_output(name), 1), _rounded(sched.reading_pace(name)),
                     recent["finished"], Latency(**recent["ttft_ms"]), Latency(**recent["itl_ms"]),
                     engine.prompt_cache[name],
                     {m: use for (lane, m), use in engine.member_prompt_cache.items() if lane == name},
                     *_drafting(sched.drafting.pairs, name))


def _drafting(pairs: dict, lane: str) -> tuple[DraftUse, dict[str, DraftUse]]:
    """A lane's drafting, and each of its members'."""
    total, members = DraftUse(), {}
    for (name, member), pair in pairs.items():
        if name == lane:
            members[member] = DraftUse(pair.drafted, pair.accepted_total, pair.length)
            total = total.plus(pair.drafted, pair.accepted_total, pair.length)
    return total, members


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 1)
