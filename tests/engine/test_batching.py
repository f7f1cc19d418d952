"""Batching must not change what a request computes beyond floating-point noise (real model).

llama.cpp's CPU kernels are not batch-invariant, so greedy text may part ways at a near
tie: the tests teacher-force the tokens of a solo run through the same request inside a
batch and compare next-token distributions position by position.
"""

from __future__ import annotations

import numpy as np
import pytest

from homeai.sched.pools import Pool
from homeai.sched.request import Request, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits
from lanes import DEFAULT_POLICIES

QUESTIONS = [
    "Explain why the sky is blue in two sentences.",
    "List three fruits that are red.",
    "What is the boiling point of water at sea level?",
    "Write a short poem about a cat sleeping in the sun, with a title.",
    "Translate 'good morning' into French and Spanish.",
    "Give me a recipe idea for dinner using rice and beans.",
    "Why do leaves change colour in autumn? Answer in detail, covering chlorophyll, carotenoids and anthocyanins.",
]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


STEP_MS = 10.0


def drive(runner, requests_by_step: dict[int, list[Request]], max_step_tokens=64, num_seqs=16,
          interactive_cells=0):
    """Run the real scheduler and runner, adding requests at given step numbers, until all finish
    (with `interactive_cells`, chat runs in the runner's second cache and summaries in the first)."""
    runner.reset()
    limits = SchedulerLimits(num_cells=4096, num_seqs=num_seqs, max_step_tokens=max_step_tokens,
                             embed_max_tokens=1024, embed_max_seqs=16, min_chunk=8,
                             interactive_cells=interactive_cells)
    policies = {name: p.__class__(**{**p.__dict__, "window_ms": 0.0}) for name, p in DEFAULT_POLICIES.items()}
    sched = Scheduler(policies, limits)
    everything = [r for rs in requests_by_step.values() for r in rs]
    for step_no in range(10_000):
        for request in requests_by_step.get(step_no, []):
            sched.add_request(request)
        if step_no > max(requests_by_step) and not sched.has_work():
            break
        plan = sched.schedule(float(step_no))
        result = runner.run(plan)
        # Every step "took" 10 ms: the cost model (which sizes each step's prefill beside the decodes)
        # learns the same machine on a busy box as on a quiet one, so the plans, and which of the
        # target's rows share a step with another's prompt chunk, do not change with the box's load.
        result.elapsed_ms = STEP_MS
        sched.update(plan, result, float(step_no) + 0.5)
    assert all(r.finished for r in everything)
    return sched


def prompt(runner, question: str) -> list[int]:
    return runner.tokenize(runner.apply_chat_template([{"role": "user", "content": question}]))


def solo_run(runner, tokens: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    request = Request("solo", "chat", "a", tokens, 0.0,
                      params=SamplingParams(temperature=0, max_tokens=n, record_logits=True))
    drive(runner, {0: [request]}, max_step_tokens=256)
    return request.output_tokens, [s.logits for s in request.samples]


def batched_run(runner, tokens, forced, *, others_tokens, interactive_cells=0) -> list[np.ndarray]:
    target = Request("target", "chat", "a", tokens, 0.0,
                     params=SamplingParams(forced_tokens=tuple(forced), record_logits=True))
    others = [Request(f"o{i}", "chat" if i % 2 else "summaries", f"m{i}", t, 0.0,
                      params=SamplingParams(temperature=0.7, seed=i, max_tokens=20 + 5 * i))
              for i, t in enumerate(others_tokens)]
    # Others arrive before, with and after the target, so it decodes beside sequences mid-prefill.
    schedule = {0: others[:3], 2: [target], 4: others[3:5], 9: others[5:]}
    sched = drive(runner, schedule, max_step_tokens=64, interactive_cells=interactive_cells)
    assert target.output_tokens == list(forced)
    if interactive_cells:
        assert sched.pools.kv[Pool.INTERACTIVE].num_cells == interactive_cells
    return [s.logits for s in target.samples]


def compare(solo_logits, batched_logits):
    kls = [kl(a, b) for a, b in zip(solo_logits, batched_logits)]
    clear = [(a, b) for a, b in zip(solo_logits, batched_logits) if np.diff(np.sort(a)[-2:])[0] > 2.0]
    agree = [int(np.argmax(a)) == int(np.argmax(b)) for a, b in clear]
    return float(np.mean(kls)), agree


@pytest.fixture(scope="module")
def solo(runner):
    tokens = prompt(runner, "Tell me about the planet Mars and why it looks red.")
    forced, logits = solo_run(runner, tokens, 32)
    return tokens, forced, logits


@pytest.mark.parametrize("interactive_cells", [0, 2048], ids=["one-cache", "interactive-cache"])
def test_batched_distributions_match_solo_within_noise(runner, solo, interactive_cells):
    """Chat and summaries together, in one cache or in two (two decode calls a step)."""
    tokens, forced, solo_logits = solo
    others = [prompt(runner, q) for q in QUESTIONS] + [prompt(runner, " ".join(QUESTIONS))]
    batched_logits = batched_run(runner, tokens, forced, others_tokens=others, interactive_cells=interactive_cells)
    mean_kl, agree = compare(solo_logits, batched_logits)
    assert len(batched_logits) == len(solo_logits) == 32
    assert mean_kl < 0.02, mean_kl
    assert agree and all(agree), f"top token differs where the solo gap is clear: {agree}"


def test_the_comparison_catches_a_wrong_logits_row(runner, solo, monkeypatch):
    """Plant a bug (each sequence reads the logits row before its own) and see the test catch it."""
    tokens, forced, solo_logits = solo
    original = runner.batch.fill

    def off_by_one(rows):
        last = original(rows)
        runner.batch.logits[: runner.batch.c.n_tokens] = 1
        return [max(row - 1, 0) for row in last]

    monkeypatch.setattr(runner.batch, "fill", off_by_one)
    others = [prompt(runner, q) for q in QUESTIONS[:4]]
    try:
        batched_logits = batched_run(runner, tokens, forced, others_tokens=others)
    finally:
        monkeypatch.undo()
        runner.reset()
    mean_kl, agree = compare(solo_logits, batched_logits)
    assert mean_kl > 0.2, f"the planted bug went unnoticed (mean KL {mean_kl})"


def test_preempted_request_resumes_with_exactly_its_tokens(runner, make_engine):
    """A background answer preempted by a chat continues from the tokens it had, none lost or repeated."""
    background_prompt = prompt(runner, "Describe a long walk through a forest in autumn. " * 12)
    chat_prompt = prompt(runner, "Name a planet. " * 50)
    # Room for both prompts but not for the background's answer too: the chat must preempt.
    # One cache for every lane (no separate interactive cache), so the chat needs the summary's cells.
    engine = make_engine(num_cells=len(background_prompt) + len(chat_prompt) + 5, num_seqs=4, interactive_cells=0)
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=60, ignore_eos=True)
    stream = engine.submit(background_prompt, lane="summaries", params=params)
    events = []
    chat_streams = []
    for event in stream:
        events.append(event)
        if len(events) == 10:  # mid-answer: chats that need the background's cells
            chat_streams = [engine.submit(chat_prompt, lane="chat",
                                          params=SamplingParams(temperature=0, max_tokens=5))]
    request = stream.request
    for s in chat_streams:
        list(s)
    assert stream.finished.reason == "length" and request.num_preemptions >= 1
    streamed = [e.token for e in events if hasattr(e, "token")]
    assert streamed == request.output_tokens and len(streamed) == 60
    assert "".join(e.text for e in events) == runner.detokenize(request.output_tokens)


def test_preempted_distributions_match_the_uninterrupted_run(runner, solo, make_engine):
    tokens, forced, solo_logits = solo
    chat_prompt = prompt(runner, "Count to ten. " * 30)
    engine = make_engine(num_cells=len(tokens) + len(chat_prompt) + 4, num_seqs=4, interactive_cells=0)
    stream = engine.submit(tokens, lane="summaries",
                           params=SamplingParams(forced_tokens=tuple(forced), record_logits=True))
    seen = 0
    for event in stream:
        seen += 1
        if seen == 8:
            chat = engine.submit(chat_prompt, lane="chat",
                                 params=SamplingParams(temperature=0, max_tokens=4))
    list(chat)
    assert stream.request.num_preemptions >= 1
    mean_kl, agree = compare(solo_logits, [s.logits for s in stream.request.samples])
    assert mean_kl < 0.02 and all(agree)


def test_a_step_without_a_slot_in_one_cache_is_undone_in_the_other(runner, monkeypatch):
    """With two caches a step is two decode calls; if the second finds no KV slot, the first's
    tokens are removed again, nothing is sampled, and the requests carry on as if it never ran."""
    import llama_cpp

    runner.reset()
    limits = SchedulerLimits(num_cells=4096, num_seqs=16, max_step_tokens=64, embed_max_tokens=1024,
                             embed_max_seqs=16, min_chunk=8, interactive_cells=2048)
    policies = {name: p.__class__(**{**p.__dict__, "window_ms": 0.0}) for name, p in DEFAULT_POLICIES.items()}
    sched = Scheduler(policies, limits)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    # The chat answers long enough to still decode when the summary's prompt is read: on a busy box
    # the cost model learns slow steps and reads that prompt a few tokens a step.
    long_params = SamplingParams(temperature=0, max_tokens=160, ignore_eos=True)
    chat = Request("chat", "chat", "a", prompt(runner, QUESTIONS[0]), 0.0, params=long_params)
    summary = Request("summary", "summaries", "b", prompt(runner, QUESTIONS[1]), 0.0, params=params)
    sched.add_request(chat)
    sched.add_request(summary)
    now = 0.0
    for _ in range(150):
        if chat.is_decoding and summary.is_decoding:
            break
        plan = sched.schedule(now)
        sched.update(plan, runner.run(plan), now)
        now += 0.1
    assert chat.is_decoding and summary.is_decoding, "both never decoded in one step"
    plan = sched.schedule(now)
    assert [i.request_id for i in plan.batches[Pool.INTERACTIVE]] == ["chat"]
    assert [i.request_id for i in plan.batches[Pool.MAIN]] == ["summary"]
    chat_pos = llama_cpp.llama_memory_seq_pos_max(runner.imemory, chat.seq_id)
    real_decode = llama_cpp.llama_decode

    def main_cache_full(ctx, batch):
        return 1 if ctx is runner.ctx else real_decode(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", main_cache_full)
    result = runner.run(plan)
    monkeypatch.undo()
    assert result.no_kv_slot and not result.samples
    assert llama_cpp.llama_memory_seq_pos_max(runner.imemory, chat.seq_id) == chat_pos, "the chat's token stayed"
    sched.update(plan, result, now)
    for _ in range(400):
        if not sched.has_work():
            break
        now += 0.1
        plan = sched.schedule(now)
        sched.update(plan, runner.run(plan), now)
    assert chat.finished and summary.finished
    assert (len(chat.output_tokens), len(summary.output_tokens)) == (160, 12)
    runner.reset()
