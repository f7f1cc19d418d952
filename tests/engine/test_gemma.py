"""Gemma 3 270M end to end beside SmolLM2 (issue 50): the second family, with its own turns, a
262k vocabulary and sliding-window attention (512 positions in 15 of its 18 layers).

SmolLM2's tests of the same behaviour are reused where they take a runner (`test_batching`,
`test_prefix_reuse`); tools with a grammar are `tests/api/test_gemma_api.py`'s. What only a
windowed cache shows is here: a prefix whose window cells llama.cpp gave to other tokens is read
again, never resumed (`prefix.Memory`). Distributions are compared, not text: llama.cpp's
kernels are not batch-invariant, and this base model answers in near-ties (see `test_batching`).
"""

from __future__ import annotations

import pytest

from homeai.sched.pools import Pool
from homeai.sched.request import Request, SamplingParams
from homeai.sched.scheduler import Scheduler
from tests.engine import test_batching as batching
from tests.engine.test_prefix_reuse import POLICIES, Driver, assert_same, forced, greedy, reference

pytestmark = pytest.mark.model

MARKUP = ("<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>", "<|eot_id|>", "[INST]")


class GemmaDriver(Driver):
    """`Driver` with the runner's memory: where llama.cpp lets a sequence be resumed, as the engine has it."""

    def __init__(self, runner, **kwargs):
        super().__init__(runner, **kwargs)
        self.sched = Scheduler(POLICIES, self.sched.limits, memory=runner.kv_memory)


def user(runner, text: str) -> list[int]:
    return runner.tokenize(runner.apply_chat_template([{"role": "user", "content": text}]))


def test_a_reply_is_text_and_ends_at_the_end_of_its_turn(gemma_runner, make_gemma_engine):
    engine = make_gemma_engine()
    assert engine.scheduler.pools.memory.window == 512, "the engine's prompt cache knows Gemma's window"
    prompt = user(gemma_runner, "Name three fruits.")
    assert gemma_runner.detokenize(prompt).endswith("model\n"), "the prompt ends in the model's own turn"
    stream = engine.submit(prompt, params=SamplingParams(temperature=0, max_tokens=8))
    text = "".join(e.text for e in stream)
    assert stream.request.output_tokens and not any(mark in text for mark in MARKUP)
    end_of_turn = gemma_runner.tokenize("<end_of_turn>", add_special=False, special=True)
    apple = gemma_runner.tokenize(" Apple", add_special=False)
    stream = engine.submit(prompt, params=SamplingParams(forced_tokens=tuple(apple + end_of_turn + apple)))
    text = "".join(e.text for e in stream)
    assert stream.finished.reason == "stop" and text == " Apple", "the turn ends at <end_of_turn>, unwritten"


def test_two_members_each_get_tokens_while_the_other_streams(gemma_runner, make_gemma_engine):
    engine = make_gemma_engine()
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    alice = engine.submit(user(gemma_runner, "Tell me about apples."), member="alice", params=params)
    bob = engine.submit(user(gemma_runner, "Tell me about pears."), member="bob", params=params)
    for stream in (alice, bob):
        assert len([e for e in stream if hasattr(e, "token")]) == 16
    a, b = alice.request, bob.request
    assert a.first_token_time < b.finish_time and b.first_token_time < a.finish_time, "neither waited for the other"


def test_a_second_turn_resumes_the_first_with_the_same_distributions(gemma_runner):
    """The issue's case: a greedy two-turn chat gave another second answer with the cache on. Its
    cells were resumed exactly (a short chat gives no window cell away); the answers parted at a
    near-tie, batch noise: the first turn's answer was computed token by token, not as a prompt."""
    first = user(gemma_runner, "Name three fruits.")
    d = GemmaDriver(gemma_runner)
    turn1 = greedy(first, 8, "turn1")
    d.run(turn1)
    messages = [{"role": "user", "content": "Name three fruits."},
                {"role": "assistant", "content": gemma_runner.detokenize(turn1.output_tokens)},
                {"role": "user", "content": "Name three vegetables."}]
    tokens = gemma_runner.tokenize(gemma_runner.apply_chat_template(messages))
    outputs, ref = reference(gemma_runner, tokens, n=6)
    d = GemmaDriver(gemma_runner)
    d.run(greedy(first, 8, "turn1"))
    target = forced(tokens, outputs)
    d.run(target)
    assert target.num_cached_tokens >= len(first) - 1, "the whole first turn was resumed"
    assert_same(ref, target)


def test_a_prefix_whose_window_was_given_away_is_read_again(gemma_runner):
    """A's cells are freed once E (800 tokens) is cached, so llama.cpp's next placement starts in A's
    hole and goes on into E's cells that fell out of E's window (positions below 800 - 512): F's
    tokens take them. T shares E's first 300 tokens, whose window starts at position 0: resumed
    from E it would attend to cells F now holds; it is read again instead."""
    tok = lambda text: gemma_runner.tokenize(text, special=True)  # noqa: E731
    house = "<start_of_turn>user\nThe house: " + " ".join(f"room {k} has lamp {k} and blind {k}." for k in range(60))
    e_tokens = tok(house)[:760] + tok(" Which rooms have blinds?<end_of_turn>\n<start_of_turn>model\n")[1:]
    t_tokens = e_tokens[:300] + tok(" Which lamp is on?<end_of_turn>\n<start_of_turn>model\n")[1:]
    outputs, ref = reference(gemma_runner, t_tokens, n=4)
    d = GemmaDriver(gemma_runner, max_cells=len(e_tokens) + 2)  # A is evicted once E is cached
    d.sched.pools.expire = lambda b_over_c: None  # and only then: not when this box's step times say
    d.run(greedy(tok("Good morning, house. What is the weather like today in the garden?"), 2, "A"))
    d.run(greedy(e_tokens, 2, "E"))
    (seq,) = d.sched.pools.cache[Pool.MAIN].entries
    f = Request("F", "chat", "a", tok("Story: " + "the warm quiet room " * 70), 0.0,
                params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    d.run(f, until=lambda: f.is_decoding)  # F's prompt is placed, F still holds its cells
    first, end = gemma_runner.held(Pool.MAIN, seq)
    assert 0 < first and end == len(e_tokens) + 1, f"llama.cpp gave E's positions below {first} to F"
    target = forced(t_tokens, outputs)
    d.run(target)
    assert target.num_cached_tokens == 0, "E's window before position 300 is gone: nothing of it is resumed"
    assert_same(ref, target)


def test_a_prompt_past_the_window_read_in_chunks_gives_the_same_distributions(gemma_runner):
    """Chunks of 48 tokens (each reading the window before it from the cache) against chunks of 256."""
    tokens = user(gemma_runner, " ".join(f"Lamp {k} is in room {k % 7}." for k in range(80)) + " Which lamps are in room 3?")
    assert len(tokens) > 600
    outputs, whole = batching.solo_run(gemma_runner, tokens, 4)
    chunked = Request("chunked", "chat", "a", tokens, 0.0, params=SamplingParams(forced_tokens=tuple(outputs), record_logits=True))
    batching.drive(gemma_runner, {0: [chunked]}, max_step_tokens=48)
    mean_kl, agree = batching.compare(whole, [s.logits for s in chunked.samples])
    assert mean_kl < 0.02 and all(agree), (mean_kl, agree)


def test_a_preempted_answer_resumes_with_exactly_its_tokens(gemma_runner, make_gemma_engine):
    batching.test_preempted_request_resumes_with_exactly_its_tokens(gemma_runner, make_gemma_engine)


@pytest.fixture
def refusing_cuts(gemma_runner, monkeypatch):
    """llama.cpp refusing to cut a sequence inside the positions it holds (as a recurrent state's
    cache does), from when the test calls it; a whole sequence, or nothing past its end, still goes."""
    import llama_cpp as ll
    real = ll.llama_memory_seq_rm

    def seq_rm(memory, seq_id, p0, p1):
        return False if 0 < p0 <= ll.llama_memory_seq_pos_max(memory, seq_id) else real(memory, seq_id, p0, p1)

    def refuse():
        monkeypatch.setattr(ll, "llama_memory_seq_rm", seq_rm)
    yield refuse
    monkeypatch.undo()
    gemma_runner.reset()


def test_a_cut_llama_cpp_refuses_leaves_nothing_to_resume(gemma_runner, refusing_cuts):
    tokens = user(gemma_runner, "Which lights are in the kitchen? " * 4)
    outputs, ref = reference(gemma_runner, tokens + tokens[1:8], n=3)
    refusing_cuts()
    d = GemmaDriver(gemma_runner, max_cells=20)  # the entry is cut to 20 cells as it is cached: refused
    d.run(greedy(tokens, 2, "first"))
    d.step()
    (seq,) = d.sched.pools.cache[Pool.MAIN].entries
    assert gemma_runner.held(Pool.MAIN, seq) == (0, 0), "llama.cpp dropped it whole"
    target = forced(tokens + tokens[1:8], outputs)
    d.run(target)
    assert target.num_cached_tokens == 0, "what llama.cpp dropped is read again"
    assert_same(ref, target)


def test_a_step_on_a_cut_llama_cpp_refused_fails(gemma_runner, refusing_cuts):
    from homeai.llama import RunnerError

    tokens = user(gemma_runner, "Which lights are in the hall? " * 4)
    d = GemmaDriver(gemma_runner)
    d.run(greedy(tokens, 2, "first"))
    edited = tokens[:-6] + user(gemma_runner, "Dim them.")[1:]  # takes the entry over, cut short
    refusing_cuts()
    d.sched.add_request(greedy(edited, 2, "edited"))
    with pytest.raises(RunnerError, match="could not cut"):
        d.step()
