"""The engine with the real model: streams, stop strings, embeddings, aborts and bad input."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from homeai.engine.engine import InvalidRequest, PromptTooLong, TokenEvent
from homeai.sched.pools import Pool
from homeai.sched.request import SamplingParams
from homeai.sched.scheduler import QueueFull


def chat(runner, text: str) -> str:
    return runner.apply_chat_template([{"role": "user", "content": text}])


def test_stream_yields_tokens_then_one_finish(runner, make_engine):
    engine = make_engine()
    stream = engine.submit(chat(runner, "Say hello."), params=SamplingParams(temperature=0, max_tokens=12))
    events = list(stream)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert tokens and events[-1] is stream.finished
    assert stream.finished.reason in ("stop", "length")
    text = "".join(e.text for e in events)
    assert text == runner.detokenize(stream.request.output_tokens)
    stats = stream.finished.stats
    assert stats.output_tokens == len(stream.request.output_tokens)
    assert stats.ttft_ms is not None and stats.e2e_ms >= stats.ttft_ms
    assert len(stats.itls_ms) == max(len(tokens) - 1, 0) or stats.outcome == "stop"


def test_stop_string_ends_the_answer_and_is_not_shown(runner, make_engine):
    engine = make_engine()
    params = SamplingParams(temperature=0, max_tokens=40)
    question = "Name the capital of France."  # worded so SmolLM2, under its default system prompt, says Paris
    full = "".join(e.text for e in engine.submit(chat(runner, question), params=params))
    assert "Paris" in full
    cut = "".join(e.text for e in engine.submit(chat(runner, question),
                                                 params=SamplingParams(temperature=0, max_tokens=40,
                                                                       stop=("Paris",))))
    assert "Paris" not in cut and full.startswith(cut)
    assert engine.state().total("cells_used") == 0


def test_seeded_sampling_repeats(runner, make_engine):
    engine = make_engine()
    params = SamplingParams(temperature=0.9, seed=1234, max_tokens=16)
    a = [e.token for e in engine.submit(chat(runner, "Tell me a joke."), params=params) if isinstance(e, TokenEvent)]
    b = [e.token for e in engine.submit(chat(runner, "Tell me a joke."), params=params) if isinstance(e, TokenEvent)]
    assert a == b


def test_async_streams_run_concurrently(runner, make_engine):
    engine = make_engine()

    async def main():
        prompts = [chat(runner, q) for q in ("Count to five.", "Name two oceans.", "What is 3+4?")]
        return await asyncio.gather(*[engine.generate(p, params=SamplingParams(temperature=0, max_tokens=10))
                                      for p in prompts])

    results = asyncio.run(main())
    assert all(f.reason in ("stop", "length") and text for text, f in results)
    assert engine.scheduler.pools.cells_used(Pool.MAIN) == 0


def test_abort_frees_the_sequence_and_others_carry_on(runner, make_engine):
    engine = make_engine()
    params = SamplingParams(temperature=0.7, max_tokens=200, ignore_eos=True)
    long_one = engine.submit(chat(runner, "Write a long story."), params=params)
    other = engine.submit(chat(runner, "Say yes."), params=SamplingParams(temperature=0, max_tokens=8))
    for i, _ in enumerate(long_one):
        if i == 3:
            long_one.abort()
    assert long_one.finished.reason == "abort"
    assert len(long_one.request.output_tokens) < 200
    list(other)
    assert other.finished.reason in ("stop", "length")
    assert engine.scheduler.pools.cells_used(Pool.MAIN) == 0 and not engine.scheduler.running


def test_embeddings_have_the_model_dimension_and_are_deterministic(runner, make_engine):
    engine = make_engine()
    texts = ["The cat sat on the mat.", "Quarterly tax forms are due in April.", "A kitten slept on a rug.",
             "Bake the bread at 220 degrees."]

    async def embed(batch):
        return await engine.embed(batch)

    vecs, num_tokens = asyncio.run(embed(texts))
    again, _ = asyncio.run(embed(texts))
    assert all(v.shape == (runner.info.embed_n_embd,) for v in vecs) and num_tokens > 0
    for a, b in zip(vecs, again):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    alone = [asyncio.run(embed([t]))[0][0] for t in texts]
    cosines = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(vecs, alone)]
    assert min(cosines) > 0.999, cosines
    sim = lambda i, j: float(np.dot(vecs[i], vecs[j]))
    assert sim(0, 2) > sim(0, 1), "the cat and the kitten should be closer than the cat and taxes"


def test_an_embedding_chunked_over_small_steps_equals_the_one_step_embedding(runner, make_engine):
    text = " ".join(f"Note {i}: the boiler was serviced and the filter replaced." for i in range(12))
    whole, _ = asyncio.run(make_engine().embed([text]))
    engine = make_engine(max_step_tokens=32, embed_chunked=True)  # every step carries at most 32 tokens
    chunked, num_tokens = asyncio.run(engine.embed([text]))
    assert num_tokens > 3 * 32, "the input spans several steps"
    cosine = float(np.dot(whole[0], chunked[0]) / np.linalg.norm(whole[0]) / np.linalg.norm(chunked[0]))
    assert cosine > 0.9999, cosine
    assert not engine.scheduler.pools.kv[Pool.EMBED].allocated


def test_bad_input_gets_clear_errors_and_the_engine_keeps_serving(runner, make_engine):
    engine = make_engine()
    with pytest.raises(InvalidRequest, match="empty"):
        engine.submit("   ")
    with pytest.raises(InvalidRequest, match="empty"):
        engine.submit([])
    with pytest.raises(PromptTooLong, match="tokens but at most"):
        engine.submit(list(range(10, 10 + runner.info.max_seq_len + 5)))
    with pytest.raises(InvalidRequest, match="max_tokens"):
        engine.submit("hello", params=SamplingParams(max_tokens=-3))
    with pytest.raises(InvalidRequest, match="unknown lane 'disco'"):
        engine.submit("hello", lane="disco")
    with pytest.raises(InvalidRequest, match="token ids"):
        engine.submit([5, -1, 7])
    stream = engine.submit(chat(runner, "Say ok."), params=SamplingParams(temperature=0, max_tokens=4))
    list(stream)
    assert stream.finished.reason in ("stop", "length")


def test_a_full_lane_is_refused_while_other_lanes_take_work(runner, make_engine):
    from lanes import DEFAULT_POLICIES

    policies = dict(DEFAULT_POLICIES)
    summaries = policies["summaries"]
    policies["summaries"] = summaries.__class__(**{**summaries.__dict__, "max_queue": 2, "window_ms": 60_000})
    engine = make_engine(policies=policies)
    params = SamplingParams(temperature=0, max_tokens=4)
    held = [engine.submit(chat(runner, "hi"), lane="summaries", params=params) for _ in range(2)]
    with pytest.raises(QueueFull):
        engine.submit(chat(runner, "hi"), lane="summaries", params=params)
    stream = engine.submit(chat(runner, "Say ok."), lane="chat", params=params)
    list(stream)
    assert stream.finished.reason in ("stop", "length")
    assert engine.state().lanes["summaries"].rejected == 1
    for s in held:
        s.abort()


def test_background_waits_while_paused_and_interactive_work_still_runs(runner, make_engine):
    """What a spoken question's transcription asks of the engine: background steps stop, a chat
    still gets its answer, and the background request carries on afterwards with nothing lost."""
    import time

    engine = make_engine()
    summary = engine.submit(chat(runner, "Describe the sea. " * 20), lane="summaries",
                            params=SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    first = next(iter(summary))  # running, mid-answer
    with engine.background_paused():
        steps = engine.counters["steps"]
        time.sleep(0.5)
        assert engine.counters["steps"] - steps <= 1, "background kept stepping (one step may be in flight)"
        assert len(summary.request.output_tokens) < 40
        answer = list(engine.submit(chat(runner, "Say hi."), params=SamplingParams(temperature=0, max_tokens=5)))
        assert answer[-1].reason in ("stop", "length")
    rest = list(summary)
    assert summary.finished.reason == "length" and len(summary.request.output_tokens) == 40
    assert [first.token] + [e.token for e in rest if isinstance(e, TokenEvent)] == summary.request.output_tokens
