"""The app's Prometheus registry (several apps, several registries); `api/metrics.py` serves it.

Histograms and counters are fed by `engine.on_finish` (`Metrics.observe`, in the engine
thread: label children are made once, so an observation is a lock and a bucket search).
Gauges, and the rejection counter the engine keeps, are read from `engine.state()` at
scrape time. Every per-lane series carries the label `lane`; none carries a member.

What a scrape that is not an admin's gets (`render(admin=False)`, `admin_only`): only families
whose change across one request says that a request happened, which the queue and running
gauges show anyway. Left out are the families that count tokens (`TOKEN_COUNT_FAMILIES`, the
prompt cache's: a prompt's length, issue 26) and those that move once per token
(`PER_TOKEN_FAMILIES`, issue 55): the ITL histogram observes each output token after the first
(its count moved by an answer's `completion_tokens - 1`), and the engine's step counter moves
once a decode step (an answer alone on the box: its tokens + 1 or 2). Counting them in coarse
buckets would not do: a member who knows where the count stands (an idle box, their own
requests) sees it cross a bucket's edge. What stays is per request: requests by outcome,
queue, TTFT and end-to-end times (one observation each), preemptions, rejections, queue depth,
running sequences. Times do say roughly how long an answer ran, as polling the running gauge
would; they give no count.

No FastAPI here: the runtime builds the registry, the route (`api/metrics.py`) checks who asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from homeai.engine.state import EngineState
from homeai.engine.stats import RequestStats

OUTCOMES = ("stop", "length", "abort", "error")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    def __init__(self, lanes: Iterable[str], state: Callable[[], EngineState | None]):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        hist = {
            "queue": Histogram("homeai_queue_seconds", "Arrival to admission", ["lane"],
                               buckets=LATENCY_BUCKETS, registry=r),
            "ttft": Histogram("homeai_ttft_seconds", "Arrival to first token (embeddings: to the vector)",
                              ["lane"], buckets=LATENCY_BUCKETS, registry=r),
            "itl": Histogram("homeai_itl_seconds", "Time between consecutive output tokens", ["lane"],
                             buckets=ITL_BUCKETS, registry=r),
            "e2e": Histogram("homeai_e2e_seconds", "Arrival to the end of the request", ["lane"],
                             buckets=E2E_BUCKETS, registry=r),
        }
        requests = Counter("homeai_requests", "Finished requests by outcome", ["lane", "outcome"], registry=r)
        prompt = Counter("homeai_prompt_tokens", "Prompt tokens of finished requests", ["lane"], registry=r)
        output = Counter("homeai_output_tokens", "Output tokens of finished requests", ["lane"], registry=r)
        preempt = Counter("homeai_preemptions", "Preemptions of finished requests", ["lane"], registry=r)
        self._lanes = {
            lane: {**{k: h.labels(lane) for k, h in hist.items()},
                   "requests": {o: requests.labels(lane, o) for o in OUTCOMES},
                   "prompt": prompt.labels(lane), "output": output.labels(lane), "preempt": preempt.labels(lane)}
            for lane in lanes}
        self.registry.register(SnapshotCollector(state))

    def observe(self, stats: RequestStats) -> None:
        """One finished request (an `engine.on_finish` callback)."""
        m = self._lanes.get(stats.lane)
        if m is None:
            return
        if stats.queue_ms is not None:
            m["queue"].observe(stats.queue_ms / 1000.0)
        if stats.ttft_ms is not None:
            m["ttft"].observe(stats.ttft_ms / 1000.0)
        for itl in stats.itls_ms:
            m["itl"].observe(itl / 1000.0)
        m["e2e"].observe(stats.e2e_ms / 1000.0)
        if stats.outcome in m["requests"]:
            m["requests"][stats.outcome].inc()
        m["prompt"].inc(stats.prompt_tokens)
        m["output"].inc(stats.output_tokens)
        if stats.preemptions:
            m["preempt"].inc(stats.preemptions)

    def render(self, *, admin: bool = True) -> bytes:
        """The exposition; without the families that tell token counts (`admin_only`) unless `admin`."""
        return generate_latest(self.registry if admin else _MembersView(self.registry))


TOKEN_COUNT_FAMILIES = ("homeai_prompt_tokens", "homeai_output_tokens", "homeai_kv_cells_used", "homeai_kv_cells_free")
PER_TOKEN_FAMILIES = ("homeai_itl_seconds", "homeai_engine_steps")  # observed once a token, or a step


def admin_only(family: str) -> bool:
    """Whether a metric family tells a request's token count (an admin's: `Metrics.render`)."""
    return (family in TOKEN_COUNT_FAMILIES or family in PER_TOKEN_FAMILIES
            or family.startswith(("homeai_prompt_cache_", "homeai_draft_")))


class _MembersView:
    """A registry's families other than the admin's (what `generate_latest` reads)."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return (family for family in self.registry.collect() if not admin_only(family.name))


class SnapshotCollector:
    """Gauges and the engine's rejection counts, read when Prometheus scrapes."""

    def __init__(self, state: Callable[[], EngineState | None]):
        self.state = state

    def describe(self) -> list[Metric]:
        return []  # the series depend on the engine; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        state = self.state()
        loaded = GaugeMetricFamily("homeai_model_loaded", "1 once the model is loaded and the engine runs")
        loaded.add_metric([], 1.0 if state else 0.0)
        yield loaded
        if not state:
            return
        families = {
            "queued": GaugeMetricFamily("homeai_queue_depth", "Requests waiting in the lane", labels=["lane"]),
            "running": GaugeMetricFamily("homeai_running_sequences", "Sequences admitted and running",
                                         labels=["lane"]),
            "rejected": CounterMetricFamily("homeai_rejections", "Requests refused because the lane queue was full",
                                            labels=["lane"]),
        }
        for lane, lane_state in state.lanes.items():
            for key, family in families.items():
                family.add_metric([lane], float(getattr(lane_state, key)))
        yield from families.values()
        yield from _prompt_cache(state)
        yield from _drafting(state)
        for name, help_text, value in (
                ("homeai_kv_cells_used", "KV cache cells held by live sequences", state.total("cells_used")),
                ("homeai_kv_cells_free", "KV cache cells free (cached prefixes count as free: they give way)",
                 state.total("cells_total") - state.total("cells_used")),
                ("homeai_sequences_used", "Sequence ids in use", state.total("seqs_used"))):
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], float(value))
            yield gauge
        steps = CounterMetricFamily("homeai_engine_steps", "Engine iterations run")
        steps.add_metric([], float(state.steps))
        yield steps


def _drafting(state: EngineState) -> Iterable[Metric]:
    """`homeai_draft_*`: per lane, tokens drafted for its answers, those accepted, and the draft length now."""
    drafted = CounterMetricFamily("homeai_draft_tokens", "Tokens drafted for the lane's answers and checked",
                                  labels=["lane"])
    accepted = CounterMetricFamily("homeai_draft_accepted_tokens", "Drafted tokens the model picked itself",
                                   labels=["lane"])
    length = GaugeMetricFamily("homeai_draft_length", "Tokens an answer of the lane drafts a step now (0: none)",
                               labels=["lane"])
    for lane, lane_state in state.lanes.items():
        use = lane_state.drafting
        drafted.add_metric([lane], float(use.drafted))
        accepted.add_metric([lane], float(use.accepted))
        length.add_metric([lane], float(use.length))
    yield from (drafted, accepted, length)


def _prompt_cache(state: EngineState) -> Iterable[Metric]:
    """`homeai_prompt_cache_*`: per lane, prompt tokens read from the cache against all of them;
    per KV cache, the cells and entries cached prefixes hold."""
    prompt = CounterMetricFamily("homeai_prompt_cache_prompt_tokens", "Prompt tokens of finished generations",
                                 labels=["lane"])
    cached = CounterMetricFamily("homeai_prompt_cache_hit_tokens",
                                 "Prompt tokens found in the prompt cache instead of computed", labels=["lane"])
    hits = CounterMetricFamily("homeai_prompt_cache_hits", "Finished generations that reused cached tokens",
                               labels=["lane"])
    rate = GaugeMetricFamily("homeai_prompt_cache_hit_rate", "Share of prompt tokens read from the cache",
                             labels=["lane"])
    for lane, lane_state in state.lanes.items():
        use = lane_state.prompt_cache
        prompt.add_metric([lane], float(use.prompt_tokens))
        cached.add_metric([lane], float(use.cached_tokens))
        hits.add_metric([lane], float(use.hits))
        rate.add_metric([lane], use.hit_rate)
    cells = GaugeMetricFamily("homeai_prompt_cache_cells", "KV cells held by cached prefixes", labels=["cache"])
    entries = GaugeMetricFamily("homeai_prompt_cache_entries", "Cached prefixes", labels=["cache"])
    for name, cache in state.caches.items():
        cells.add_metric([name], float(cache.cells_cached))
        entries.add_metric([name], float(cache.entries))
    yield from (prompt, cached, hits, rate, cells, entries)
