"""Grammar sampling within a step budget (issue 55, real model): a refused pick is weighed again in
chunks, in score order, with the clock read between them; chunked weighing picks what weighing the
whole vocabulary picks; a request whose grammar takes longer than `[grammar] step_budget_ms` to pick a
token ends with an error its client sees, and the step's other requests go on."""

from __future__ import annotations

import ctypes

import llama_cpp as ll
import numpy as np
import pytest

from homeai.llama import sampling
from homeai.llama.grammar import json_schema_grammar
from homeai.llama.sampling import GrammarOverBudget, build_sampler, grammar_sampler
from homeai.sched.request import Grammar, SamplingParams

pytestmark = pytest.mark.model

GRAMMARS = ['root ::= [a-z]+ | [0-9]+', 'root ::= "zq" [0-9]* "x"', 'root ::= ("yes" | "no" | "maybe") "."']
SLOW = json_schema_grammar({"type": "string", "pattern": "^(((((([a-z])+)+)+)+)+)+[a-z]{40}$"})  # ~1-8 s a whole pass
SETTINGS = [SamplingParams(temperature=0), SamplingParams(temperature=0.9, top_k=40, seed=7),
            SamplingParams(temperature=0.9, top_k=0, seed=7), SamplingParams(temperature=0.7, repeat_penalty=1.2, seed=7)]


def whole_vocabulary_pick(runner, logits, grammar_text: str, params: SamplingParams) -> int | None:
    """The chain's pick if the grammar allows it, else its pick over the whole vocabulary with the
    grammar's refusals at -inf, weighed in one pass (the runner's way before issue 55)."""
    grammar = grammar_sampler(runner.vocab, Grammar(grammar_text))
    chain = build_sampler(params, runner.n_vocab)
    try:
        cur = runner.sampler.candidates.fill(logits)
        ll.llama_sampler_apply(chain, ctypes.byref(cur))
        token = int(cur.data[cur.selected].id)
        if runner.sampler.candidates.allows(grammar, token):
            return token
        cur = runner.sampler.candidates.fill(logits)
        ll.llama_sampler_apply(grammar, ctypes.byref(cur))
        ll.llama_sampler_apply(chain, ctypes.byref(cur))
        if cur.selected < 0 or not np.isfinite(cur.data[cur.selected].logit):
            return None
        return int(cur.data[cur.selected].id)
    finally:
        ll.llama_sampler_free(chain)
        ll.llama_sampler_free(grammar)


def runner_pick(runner, logits, grammar_text: str, params: SamplingParams) -> int | None:
    grammar = grammar_sampler(runner.vocab, Grammar(grammar_text))
    chain = build_sampler(params, runner.n_vocab)
    try:
        return runner.sampler._sample_in_grammar(logits, chain, grammar, params)
    finally:
        ll.llama_sampler_free(chain)
        ll.llama_sampler_free(grammar)


@pytest.mark.parametrize("params", SETTINGS, ids=["greedy", "top_k", "no_top_k", "penalty"])
@pytest.mark.parametrize("grammar", GRAMMARS)
def test_chunked_weighing_picks_what_the_whole_vocabulary_picks(runner, grammar, params, monkeypatch):
    """Greedy: the same token. Sampling: the same token from the same seed (the same candidates reach
    the chain: the best-scored ones when they decide, else the whole vocabulary in id order), so the
    same distribution. Small chunks, so that many are weighed."""
    monkeypatch.setattr(sampling, "CHUNK", 1000)
    monkeypatch.setattr(runner.sampler, "grammar_budget_s", 60.0)
    rng = np.random.default_rng(11)
    for _ in range(4):
        logits = (rng.normal(size=runner.n_vocab) * 3).astype(np.float32)
        assert runner_pick(runner, logits, grammar, params) == whole_vocabulary_pick(runner, logits, grammar, params)


def allowed_by(runner, grammar_text: str) -> np.ndarray:
    """The tokens a fresh grammar allows first, from one pass over the whole vocabulary."""
    grammar = grammar_sampler(runner.vocab, Grammar(grammar_text))
    try:
        cur = runner.sampler.candidates.fill(np.zeros(runner.n_vocab, dtype=np.float32))
        ll.llama_sampler_apply(grammar, ctypes.byref(cur))
        return runner.sampler.candidates.data["id"][:cur.size][np.isfinite(runner.sampler.candidates.data["logit"][:cur.size])]
    finally:
        ll.llama_sampler_free(grammar)


@pytest.fixture
def counted(runner, monkeypatch):
    """The sizes of the chunks the runner weighs."""
    sizes = []
    weigh = runner.sampler.candidates.weigh

    def counting(grammar, ids, logits):
        sizes.append(len(ids))
        return weigh(grammar, ids, logits)

    monkeypatch.setattr(runner.sampler.candidates, "weigh", counting)
    return sizes


def test_a_refused_pick_is_weighed_in_chunks_in_score_order_until_one_decides(runner, counted, monkeypatch):
    """The allowed tokens all score far down (from the 10,000th): the chunks go on, in score order,
    until one holds one; greedy then takes the best of them without weighing the rest."""
    monkeypatch.setattr(sampling, "CHUNK", 2000)
    monkeypatch.setattr(runner.sampler, "grammar_budget_s", 60.0)
    digits = allowed_by(runner, "root ::= [0-9]")
    others = np.setdiff1d(np.arange(runner.n_vocab), digits)
    order = np.concatenate((others[:10_000], np.random.default_rng(5).permutation(digits), others[10_000:]))
    logits = np.empty(runner.n_vocab, dtype=np.float32)
    logits[order] = np.linspace(10.0, 0.0, runner.n_vocab, dtype=np.float32)  # order[0] best
    assert runner_pick(runner, logits, "root ::= [0-9]", SamplingParams(temperature=0)) == order[10_000]
    assert counted[0] == sampling.WEIGHED_FIRST and len(counted) >= 5
    assert 10_000 < sum(counted) < runner.n_vocab / 2  # not the whole vocabulary


def test_a_grammar_past_the_step_budget_is_cut_short(runner, counted, monkeypatch):
    """A grammar whose whole pass takes seconds (nested repeats, once a few letters are in) is stopped
    between two chunks once the budget is spent: the request is told why, and most of the vocabulary
    is never weighed."""
    monkeypatch.setattr(runner.sampler, "grammar_budget_s", 0.02)
    grammar = grammar_sampler(runner.vocab, Grammar(SLOW))
    for piece in '"abcdefg':  # its stacks multiply with each letter taken
        ll.llama_sampler_accept(grammar, runner.tokenize(piece, add_special=False)[0])
    params = SamplingParams(temperature=0, repeat_penalty=1.1)  # (a penalty: no number of best tokens decides)
    chain = build_sampler(params, runner.n_vocab)
    logits = np.zeros(runner.n_vocab, dtype=np.float32)
    logits[runner.tokenize("!", add_special=False)[0]] = 10.0  # the chain's pick, which the grammar refuses
    try:
        with pytest.raises(GrammarOverBudget, match="step_budget_ms = 20"):
            runner.sampler._sample_in_grammar(logits, chain, grammar, params)
    finally:
        ll.llama_sampler_free(chain)
        ll.llama_sampler_free(grammar)
    assert sum(counted) < runner.n_vocab / 4


def test_a_members_grammars_share_one_budget_a_step(runner, monkeypatch):
    """Two of alice's grammars in one step cannot take two budgets: once her grammars have spent the
    step's, her next pick that needs weighing ends, naming what her others took; bob's same pick, in
    the same step, has a budget of its own; the next step gives alice hers again."""
    monkeypatch.setattr(runner.sampler, "grammar_budget_s", 60.0)
    monkeypatch.setattr(runner.sampler, "_grammar_spent", {"alice": 60.0})  # her grammars' time so far this step
    digits = allowed_by(runner, "root ::= [0-9]")
    logits = np.zeros(runner.n_vocab, dtype=np.float32)
    logits[np.setdiff1d(np.arange(runner.n_vocab), digits)[:1000]] = 5.0  # the best 1,000 all refused
    alice, bob = SamplingParams(temperature=0, owner="alice"), SamplingParams(temperature=0, owner="bob")
    with pytest.raises(GrammarOverBudget, match="after 60000 ms of its member's other grammars in this step"):
        runner_pick(runner, logits, "root ::= [0-9]", alice)
    assert runner_pick(runner, logits, "root ::= [0-9]", bob) in set(digits.tolist())
    assert runner.sampler._grammar_spent["bob"] < 60.0
    runner.sampler._grammar_spent.clear()  # what a step's collect does first
    assert runner_pick(runner, logits, "root ::= [0-9]", alice) in set(digits.tolist())


@pytest.mark.parametrize("plan_ahead", [False, True], ids=["plain", "ahead"])
def test_a_request_past_the_budget_ends_with_an_error_and_the_others_go_on(runner, make_engine, monkeypatch, plan_ahead):
    """bob's free answer and alice's grammar share steps; alice's grammar cannot pick within the
    budget (a literal the model never scores high: the whole vocabulary to weigh, far over 0.05 ms):
    her answer ends with an error saying why, bob's runs to its length."""
    monkeypatch.setattr(runner.sampler, "grammar_budget_s", 0.00005)
    engine = make_engine(plan_ahead=plan_ahead)
    prompt = runner.tokenize(runner.apply_chat_template([{"role": "user", "content": "Tell me about the sea."}]))
    bob = engine.submit(prompt, lane="chat", member="bob",
                        params=SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    alice = engine.submit(prompt, lane="chat", member="alice",
                          params=SamplingParams(temperature=0, max_tokens=12, grammar=Grammar('root ::= "zqxj" [0-9]+')))
    assert alice.request.params.owner == "alice"  # her grammars share one budget a step
    alice_events, bob_events = list(alice), list(bob)
    finish = alice_events[-1]
    assert finish.reason == "error" and "step_budget_ms" in finish.error
    assert alice.request.finish_reason == "error"
    assert bob_events[-1].reason == "length" and bob_events[-1].stats.output_tokens == 12
    later = engine.submit(prompt, lane="chat", member="alice", params=SamplingParams(temperature=0, max_tokens=3))
    assert list(later)[-1].reason == "length"  # the engine serves on
