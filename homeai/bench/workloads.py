"""Benchmark workloads: seeded lists of request specs (when, which lane and member, how long).

* `continuous`: N requests, fixed prompt length, exponential output lengths; all at once
  or Poisson arrivals (the classic static vs continuous batching comparison).
* `household`: members chatting (Poisson, short prompts, multi-turn), voice questions, and
  background work at once: long documents to summarise, embedding and indexing batches.
* `fairness`: two members on one lane, one sending ten times as much as the other.

Prompts are token ids drawn from ordinary vocabulary: the scheduler and the model's speed
depend on lengths, not on words, and exact lengths keep a run repeatable.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Spec:
    request_id: str
    arrival_s: float
    lane: str
    member: str
    prompt_len: int
    output_len: int  # 0 for embeddings
    kind: str = "generate"  # generate | embed
    group: str = ""  # short | long, for the report's split
    seed: int = 0


@dataclass(frozen=True)
class Workload:
    name: str
    specs: list[Spec]
    params: dict = field(default_factory=dict)  # the distributions used, for the report

    def without_lanes(self, lanes: set[str]) -> "Workload":
        return Workload(f"{self.name} without {','.join(sorted(lanes))}",
                        [s for s in self.specs if s.lane not in lanes], self.params)

    def only_lanes(self, lanes: set[str]) -> "Workload":
        return Workload(f"{self.name} only {','.join(sorted(lanes))}",
                        [s for s in self.specs if s.lane in lanes], self.params)

    def to_dict(self) -> dict:
        return {"name": self.name, "params": self.params, "num_requests": len(self.specs),
                "lanes": sorted({s.lane for s in self.specs})}


def prompt_tokens(spec: Spec, low: int = 1000, high: int = 40000) -> list[int]:
    rng = random.Random(f"{spec.request_id}:{spec.seed}")
    return [rng.randrange(low, high) for _ in range(spec.prompt_len)]


def continuous(n: int = 32, prompt_len: int = 32, mean_output: int = 128, rate: float | None = None,
               seed: int = 0, max_output: int = 512) -> Workload:
    """N chat requests, exponential output lengths; all at t=0, or Poisson at `rate` per second."""
    rng = random.Random(seed)
    t, specs = 0.0, []
    outputs = [min(max(int(rng.expovariate(1 / mean_output)), 1), max_output) for _ in range(n)]
    median = sorted(outputs)[n // 2]
    for i, out in enumerate(outputs):
        if rate:
            t += rng.expovariate(rate)
        specs.append(Spec(f"c{i}", t, "chat", f"m{i % 4}", prompt_len, out,
                          group="long" if out > median else "short", seed=seed))
    return Workload("continuous", specs, {
        "requests": n, "prompt_len": prompt_len, "output_len": f"exponential(mean={mean_output}), capped at {max_output}",
        "arrivals": f"poisson(rate={rate}/s)" if rate else "all at t=0", "seed": seed})


def household(duration_s: float = 40.0, seed: int = 0, members: int = 3, chat_rate: float = 0.08,
              voice_rate: float = 0.05, documents: int = 2, doc_len: int = 2000, summary_len: int = 120,
              embed_batches: int = 2, embed_batch_size: int = 16) -> Workload:
    """A household evening: chats and voice questions while documents are summarised and embedded."""
    rng = random.Random(seed)
    specs: list[Spec] = []
    for m in range(members):
        t, n = rng.uniform(0, 3), 0
        while t < duration_s:  # multi-turn: each turn's prompt carries the conversation so far
            prompt = 40 + 40 * (n % 5) + rng.randint(0, 30)
            specs.append(Spec(f"chat-m{m}-{n}", t, "chat", f"member{m}", prompt,
                              rng.randint(30, 80), group="short", seed=seed))
            t += rng.expovariate(chat_rate)
            n += 1
    t, i = rng.uniform(1, 5), 0
    while t < duration_s:
        specs.append(Spec(f"voice-{i}", t, "voice", f"member{i % members}", rng.randint(40, 70),
                          rng.randint(15, 35), group="short", seed=seed))
        t += rng.expovariate(voice_rate)
        i += 1
    for d in range(documents):
        specs.append(Spec(f"doc-{d}", 2.0 + d * duration_s / max(documents, 1), "summaries", "jobs",
                          doc_len, summary_len, group="long", seed=seed))
    for b in range(embed_batches):
        at = 1.0 + b * duration_s / max(embed_batches, 1)
        specs += [Spec(f"idx-{b}-{k}", at, "indexing", "jobs", rng.randint(100, 300), 0, kind="embed",
                       group="short", seed=seed) for k in range(embed_batch_size)]
    specs.sort(key=lambda s: s.arrival_s)
    return Workload("household", specs, {
        "duration_s": duration_s, "members": members, "chat": f"poisson({chat_rate}/s per member), prompt 40+60*turn, output 30-80",
        "voice": f"poisson({voice_rate}/s), prompt 40-70, output 15-35",
        "summaries": f"{documents} documents of {doc_len} tokens, output {summary_len}",
        "indexing": f"{embed_batches} batches of {embed_batch_size} chunks of 100-300 tokens", "seed": seed})


def fairness(duration_s: float = 30.0, seed: int = 0, light_every_s: float = 1.0, ratio: int = 10,
             prompt_len: int = 64, output_len: int = 32) -> Workload:
    """Two members on the chat lane, one sending `ratio` times as many requests as the other."""
    rng = random.Random(seed)
    specs = []
    for member, period in (("light", light_every_s), ("heavy", light_every_s / ratio)):
        t, i = 0.0, 0
        while t < duration_s:
            specs.append(Spec(f"{member}-{i}", t, "chat", member, prompt_len, output_len, seed=seed))
            t += rng.expovariate(1 / period)
            i += 1
    specs.sort(key=lambda s: s.arrival_s)
    return Workload("fairness", specs, {"duration_s": duration_s, "light": f"poisson(every {light_every_s}s)",
                                        "heavy": f"{ratio}x the light member's rate", "prompt_len": prompt_len,
                                        "output_len": output_len, "seed": seed})


WORKLOADS = {"continuous": continuous, "household": household, "fairness": fairness}


def spec_dict(spec: Spec) -> dict:
    return asdict(spec)
