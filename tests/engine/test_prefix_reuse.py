"""Prompt-prefix reuse must not change what a request computes (real model).

Each test runs a target request twice with teacher forcing: once reading its whole prompt
with the cache off (the reference), once starting from cells another request left behind
(taken over, shared with `llama_memory_seq_cp`, trimmed, or after eviction), and compares
the next-token distributions position by position, within the batching noise the batching
tests accept.
"""

from __future__ import annotations

import numpy as np
import pytest

from homeai.sched.pools import Copy, Drop, Pool
from homeai.sched.request import Kind, Request, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits
from lanes import DEFAULT_POLICIES
from tests.engine.test_batching import compare

POLICIES = {name: p.__class__(**{**p.__dict__, "window_ms": 0.0}) for name, p in DEFAULT_POLICIES.items()}
SYSTEM = ("You are the household assistant. The house has these devices: " +
          ", ".join(f"{room} light {k}" for room in ("kitchen", "hall", "office", "bedroom") for k in range(6)) + ".")


class Driver:
    """The real scheduler over the real runner, a step at a time, every plan kept."""

    def __init__(self, runner, *, cache=True, num_cells=4096, interactive_cells=0, max_cells=0, num_seqs=8):
        runner.reset()
        self.runner = runner
        limits = SchedulerLimits(num_cells=num_cells, num_seqs=num_seqs, max_step_tokens=128, embed_max_tokens=1024,
                                 embed_max_seqs=16, min_chunk=8, interactive_cells=interactive_cells,
                                 prompt_cache=cache, prompt_cache_max_cells=max_cells)
        self.sched = Scheduler(POLICIES, limits)
        self.now = 0.0
        self.plans = []

    def step(self):
        plan = self.sched.schedule(self.now)
        self.plans.append(plan)
        self.sched.update(plan, self.runner.run(plan), self.now + 0.05)
        self.now += 0.1
        return plan

    def run(self, *requests, until=None):
        for r in requests:
            self.sched.add_request(r)
        for _ in range(5000):
            if (until is not None and until()) or (until is None and not self.sched.has_work()):
                return
            self.step()
        raise AssertionError("did not finish")

    def ops(self, pool=Pool.MAIN):
        return [op for plan in self.plans for op in plan.cache_ops.get(pool, [])]


def chat(runner, *turns: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}]
    for k, text in enumerate(turns):
        messages.append({"role": "user" if k % 2 == 0 else "assistant", "content": text})
    return prompt_of(runner, messages)


def prompt_of(runner, messages) -> list[int]:
    return runner.tokenize(runner.apply_chat_template(messages))


def greedy(tokens, n=16, rid="ref", lane="chat") -> Request:
    return Request(rid, lane, "a", list(tokens), 0.0, params=SamplingParams(temperature=0, max_tokens=n))


def forced(tokens, outputs, rid="target", lane="chat") -> Request:
    return Request(rid, lane, "a", list(tokens), 0.0,
                   params=SamplingParams(forced_tokens=tuple(outputs), record_logits=True))


def reference(runner, tokens, n=16, lane="chat"):
    """The target alone with the cache off: its greedy tokens and their distributions."""
    d = Driver(runner, cache=False)
    r = greedy(tokens, n, lane=lane)
    d.run(r)
    t = forced(tokens, r.output_tokens, lane=lane)
    d.run(t)
    return r.output_tokens, [s.logits for s in t.samples]


def assert_same(ref_logits, target: Request):
    mean_kl, agree = compare(ref_logits, [s.logits for s in target.samples])
    assert len(target.samples) == len(ref_logits)
    assert mean_kl < 0.02, mean_kl
    assert all(agree), f"top token differs where the reference's gap is clear: {agree}"


@pytest.mark.parametrize("interactive_cells", [0, 2048], ids=["one-cache", "interactive-cache"])
@pytest.mark.parametrize("lane", ["chat", "summaries"])
def test_a_hit_on_a_finished_requests_prefix(runner, interactive_cells, lane):
    first = chat(runner, "Which lights are in the kitchen?")
    turn1 = greedy(first, 12, "turn1", lane)
    d = Driver(runner, interactive_cells=interactive_cells)
    d.run(turn1)
    answer = runner.detokenize(turn1.output_tokens)
    tokens = chat(runner, "Which lights are in the kitchen?", answer, "Turn the first one on.")
    outputs, ref = reference(runner, tokens, lane=lane)
    d = Driver(runner, interactive_cells=interactive_cells)
    d.run(greedy(first, 12, "turn1", lane))
    target = forced(tokens, outputs, lane=lane)
    d.run(target)
    assert target.num_cached_tokens >= len(first) - 1, "the whole first turn was reused"
    pool = Pool.INTERACTIVE if interactive_cells and lane == "chat" else Pool.MAIN
    assert d.sched.pools.cells_cached(pool) > 0
    assert_same(ref, target)


def test_a_partial_hit_where_the_history_was_edited(runner):
    original = chat(runner, "Which lights are in the hall?", "Hall light 0 to 5.", "Dim them all.")
    edited = chat(runner, "Which lights are in the hall?", "There are six hall lights.", "Dim them all.")
    outputs, ref = reference(runner, edited)
    d = Driver(runner)
    d.run(greedy(original, 4, "before"))
    target = forced(edited, outputs)
    d.run(target)
    shared = next(k for k, (a, b) in enumerate(zip(original, edited)) if a != b)
    assert target.num_cached_tokens == shared, "reused exactly up to the edit"
    assert any(isinstance(op, Drop) and op.start == shared for op in d.ops()), "the entry's tail was dropped"
    assert_same(ref, target)


def test_a_trimmed_entry_is_reused(runner):
    tokens = chat(runner, "Is the office light on?")
    longer = chat(runner, "Is the office light on? And the bedroom?")
    shared = next(k for k, (a, b) in enumerate(zip(tokens, longer)) if a != b)
    cap = shared - 20
    outputs, ref = reference(runner, tokens)
    d = Driver(runner, max_cells=cap)  # the first request's cells are trimmed to the cap
    d.run(greedy(longer, 4, "long"))
    assert d.sched.pools.cells_cached(Pool.MAIN) == cap
    target = forced(tokens, outputs)
    d.run(target)
    assert target.num_cached_tokens == cap
    assert_same(ref, target)


def test_eviction_under_pressure_keeps_outputs_right(runner):
    tokens = chat(runner, "Turn off every light in the bedroom.")
    outputs, ref = reference(runner, tokens)
    d = Driver(runner, num_cells=len(tokens) * 2 + 40, num_seqs=4)
    # unrelated prompts (none reuses another's entry), each about as long as the target
    others = [greedy(runner.tokenize(f"Story {k}: " + "the warm room " * (len(tokens) // 3)), 4, f"o{k}")
              for k in range(3)]
    for r in others:
        d.run(r)
    target = forced(tokens, outputs)
    d.run(target)
    assert any(isinstance(op, Drop) and op.start == 0 for op in d.ops()), "entries were evicted to make room"
    assert target.num_preemptions == 0
    assert_same(ref, target)


def test_a_shared_prefix_survives_its_owner_being_preempted(runner):
    """The target shares a live sequence's cells (seq_cp); then that sequence is preempted and its
    cells dropped: the target's copies of them must stay intact."""
    tokens = chat(runner, "Summarise the devices in the house.")
    outputs, ref = reference(runner, tokens)
    d = Driver(runner, max_cells=16)  # a preempted sequence keeps 16 cells: the rest are dropped
    # the same member's (cells of another member's are shared only as far as no member wrote them)
    owner = Request("owner", "summaries", "a", chat(runner, "Summarise the devices in the house, room by room."),
                    0.0, params=SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    d.run(owner, until=lambda: owner.is_decoding)
    target = forced(tokens, outputs, lane="summaries")
    d.sched.add_request(target)
    while target.seq_id is None:
        d.step()
    assert any(isinstance(op, Copy) and op.src == owner.seq_id for op in d.ops()), "the target shares the owner's cells"
    d.sched._preempt(owner, None)  # as an interactive arrival would
    d.run()
    assert owner.num_preemptions == 1 and target.num_cached_tokens > 0
    assert_same(ref, target)


def test_embeddings_are_unchanged_with_the_cache_on(runner, make_engine):
    engine = make_engine(prompt_cache=True)
    text = SYSTEM * 2
    first = list(engine.submit(runner.tokenize(text, embedding=True), lane="embeddings", kind=Kind.EMBED))[-1]
    again = list(engine.submit(runner.tokenize(text, embedding=True), lane="embeddings", kind=Kind.EMBED))[-1]
    a, b = np.asarray(first.embedding), np.asarray(again.embedding)
    assert first.stats.cached_tokens == 0 and again.stats.cached_tokens == 0
    assert float(a @ b) > 0.9999
