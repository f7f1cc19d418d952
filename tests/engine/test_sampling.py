"""Sampling per request (real model): greedy is llama.cpp's greedy, state lives as long as its request."""

from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np

from homeai.sched.request import Request, SamplingParams
from homeai.sched.scheduler import Scheduler, SchedulerLimits
from lanes import DEFAULT_POLICIES

QUESTIONS = ["Name a colour.", "What is two plus two?", "Say something about cats.", "Count to three."]


def chat(runner, text: str) -> list[int]:
    return runner.tokenize(runner.apply_chat_template([{"role": "user", "content": text}]))


def llama_greedy(runner, logits: np.ndarray) -> int:
    """llama.cpp's own greedy sampler's pick over a row of logits."""
    greedy = ll.llama_sampler_init_greedy()
    try:
        cur = runner.sampler.candidates.fill(logits)
        ll.llama_sampler_apply(greedy, ctypes.byref(cur))
        return int(runner.sampler.candidates.data["id"][cur.selected])
    finally:
        ll.llama_sampler_free(greedy)


def test_greedy_picks_what_llama_cpps_greedy_sampler_picks(runner, make_engine):
    """Four greedy requests in one batch: each token is llama.cpp's greedy pick over its row's logits."""
    engine = make_engine()
    params = SamplingParams(temperature=0, max_tokens=6, record_logits=True, ignore_eos=True)
    streams = [engine.submit(chat(runner, q), lane="summaries", params=params) for q in QUESTIONS]
    for stream in streams:
        list(stream)
        samples = stream.request.samples
        assert len(samples) == 6
        assert [s.token for s in samples] == [llama_greedy(runner, s.logits) for s in samples]


def test_a_tie_goes_to_the_lowest_token_id_as_in_llama_cpp(runner):
    logits = np.full(runner.n_vocab, -5.0, dtype=np.float32)
    logits[[9, 300, 7000]] = 3.0
    assert llama_greedy(runner, logits) == 9 == int(logits.argmax())


def test_the_engine_and_the_raw_loop_pick_the_same_first_tokens(runner, make_engine):
    """Both read the prefill's last row of each prompt (the engine through its plan, the raw loop
    through `decode_greedy`): the same rows, the same picks."""
    prompts = [chat(runner, q) for q in QUESTIONS]
    engine = make_engine()
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    streams = [engine.submit(p, lane="summaries", params=params) for p in prompts]
    ours = [[e.token for e in stream if hasattr(e, "token")] for stream in streams]
    raw = engine.call_in_loop(lambda r: raw_loop_first(r, prompts))
    assert [t[0] for t in ours] == raw


def raw_loop_first(runner, prompts: list[list[int]]) -> list[int]:
    from homeai.sched.pools import Pool

    runner.reset()
    [picked] = runner.decode_greedy([(Pool.MAIN, [(seq, 0, p) for seq, p in enumerate(prompts)])])
    runner.reset()
    return picked


def test_the_output_rows_read_at_once_are_each_rows_logits_in_batch_order(runner):
    """A step reads its rows' logits in one pass (`Runner._outputs`): output k is the k-th token
    flagged for logits, as llama.cpp gives them row by row, with an unsampled chunk between them."""
    from homeai.sched.pools import Pool

    prompts = [chat(runner, q) for q in QUESTIONS]
    runner.reset()
    rows = runner.batch.fill([(0, 0, prompts[0], True), (1, 0, prompts[1][:5], False),
                              (2, 0, prompts[2], True), (3, 0, prompts[3], True)])
    ctx = runner._context(Pool.MAIN)
    assert ll.llama_decode(ctx, runner.batch.c) == 0
    sampled = [rows[0], rows[2], rows[3]]
    each = [np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, row), shape=(runner.n_vocab,)).copy() for row in sampled]
    together = runner._outputs(ctx, len(sampled))
    runner.reset()
    assert not np.array_equal(each[0], each[1]) and not np.array_equal(each[1], each[2])  # an order shows
    for k, row_logits in enumerate(each):
        assert np.array_equal(together[k], row_logits)


def test_a_request_keeps_sampler_state_only_while_it_runs(runner):
    """Greedy, seeded, penalised and unfiltered requests: each builds its sampling at its first
    token, and the step after it ends frees it."""
    runner.reset()
    sched = Scheduler(dict(DEFAULT_POLICIES), SchedulerLimits(num_cells=4096, num_seqs=8, max_step_tokens=256,
                                                              embed_max_tokens=256, embed_max_seqs=4))
    kinds = [SamplingParams(temperature=0, max_tokens=5),
             SamplingParams(temperature=0.8, seed=3, max_tokens=7),
             SamplingParams(temperature=0, repeat_penalty=1.3, max_tokens=9),
             SamplingParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, max_tokens=11)]
    for i, (q, params) in enumerate(zip(QUESTIONS, kinds)):
        sched.add_request(Request(f"r{i}", "summaries", "a", chat(runner, q), 0.0, params=params))
    seen = set()
    for step in range(100):
        if not sched.has_work():
            break
        plan = sched.schedule(float(step))
        sched.update(plan, runner.run(plan), float(step) + 0.5)
        seen |= set(runner.sampler.samplers)
    assert seen == {"r0", "r1", "r2", "r3"}
    plan = sched.schedule(100.0)  # nothing left to run: the step only frees what ended
    runner.run(plan)
    assert runner.sampler.samplers == {}
