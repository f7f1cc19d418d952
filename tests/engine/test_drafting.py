"""Drafting with the real model (`homeai.sched.draft`, `Runner._verify`): guesses checked in the shared
step leave the answer as it would be without them. llama.cpp is not batch-invariant (a drafted row is
computed in a wider batch), so greedy answers are compared as the batching tests compare them: the
logits at each position against the same answer read one token a step, and the text alike wherever the
model's pick is clear. Sampled answers are compared as token histograms over seeds."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from homeai.engine.stream import FinishEvent, TokenEvent
from homeai.sched import scheduler as sched_mod
from homeai.sched.draft import Acceptance, DraftSettings
from homeai.sched.request import Grammar, SamplingParams
from tests.engine.test_batching import compare

ON = DraftSettings(enabled=True, max_draft=8, lanes=frozenset({"chat", "voice"}))
DEVICES = ("light.kitchen_ceiling, light.hallway_main, cover.garage_door_left, climate.living_room_thermostat, "
           "switch.coffee_machine, media_player.lounge_speaker")
DOCUMENT = ("The council will close Mill Lane between the bridge and the school from 4 to 18 March while the "
            "water main is replaced. Buses 12 and 14 will use Station Road instead. The school stays open.")
ECHOES = [f"These are the devices: {DEVICES}. Repeat every device name above, one per line.",
          f"Here is a notice:\n\n{DOCUMENT}\n\nCopy the notice."]


def chat(runner, text: str) -> list[int]:
    return list(runner.tokenize(runner.apply_chat_template([{"role": "user", "content": text}])))


def answer(engine, tokens, member="alice", **params):
    events = list(engine.submit(list(tokens), lane="chat", member=member, params=SamplingParams(**params)))
    finish = events[-1]
    assert isinstance(finish, FinishEvent), finish
    return [e.token for e in events if isinstance(e, TokenEvent)], finish


def keen(engine, member="alice"):
    """The member's guesses held so far (19 of 20): drafting pays whatever the box's load taught the cost
    model, so a test that needs guesses checked gets them."""
    with engine.lock:
        engine.scheduler.drafting.pairs[("chat", member)] = Acceptance(accepted=[19.0, 19.0], trials=[20.0, 20.0])
    return engine


def drafted(engine, member="alice") -> tuple[int, int]:
    pair = engine.scheduler.drafting.pairs.get(("chat", member))
    return (pair.drafted, pair.accepted_total) if pair else (0, 0)


@pytest.fixture
def recorded(monkeypatch):
    """Each finished request's recorded rows (`SamplingParams.record_logits`), by request id."""
    rows: dict[str, list] = {}
    original = sched_mod.Scheduler._finish

    def keep(self, request, reason, now):
        rows[request.request_id] = [s.logits for s in request.samples]
        return original(self, request, reason, now)

    monkeypatch.setattr(sched_mod.Scheduler, "_finish", keep)
    return rows


@pytest.mark.parametrize("text", ECHOES, ids=["devices", "notice"])
def test_greedy_answers_are_the_model_own_with_guesses_checked(runner, make_engine, recorded, text):
    tokens = chat(runner, text)
    on = keen(make_engine(drafting=ON))
    on_tokens, finish = answer(on, tokens, temperature=0, max_tokens=48, record_logits=True)
    guessed, kept = drafted(on)
    assert kept >= 8, f"the echo was not drafted ({guessed} drafted, {kept} accepted)"
    assert finish.stats.output_tokens == len(on_tokens)
    on.stop()
    off = make_engine()  # the same answer read one token a step, forced to the drafted run's tokens
    forced, forced_finish = answer(off, tokens, temperature=0, max_tokens=len(on_tokens), record_logits=True,
                                   forced_tokens=tuple(on_tokens))
    assert forced == on_tokens and drafted(off) == (0, 0)
    mean_kl, agree = compare(recorded[forced_finish.stats.request_id], recorded[finish.stats.request_id])
    assert mean_kl < 0.02, mean_kl
    assert agree and all(agree), f"a pick differs where the model's choice is clear: {agree}"
    plain, _ = answer(off, tokens, temperature=0, max_tokens=48)
    parted = next((i for i, (a, b) in enumerate(zip(on_tokens, plain)) if a != b), None)
    if parted is not None:  # llama.cpp's batch noise at a near tie, never a clear pick
        gap = sorted(recorded[forced_finish.stats.request_id][parted])[-2:]
        assert gap[1] - gap[0] < 2.0, f"parted at {parted} where the pick was clear"


def test_the_comparison_catches_a_row_read_one_off(runner, make_engine, recorded, monkeypatch):
    """Plant a bug (each guess checked against the row before its own) and see the comparison catch it."""
    from homeai.llama import runner as runner_mod
    original = runner_mod.verify

    def off_by_one(sampler, memory, ctx, item, row, outputs, out, best, guess, result):
        shifted = outputs.copy()
        shifted[out + 1:out + len(guess) + 1] = outputs[out:out + len(guess)]
        return original(sampler, memory, ctx, item, row, shifted, out, shifted.argmax(axis=1).tolist(), guess, result)

    monkeypatch.setattr(runner_mod, "verify", off_by_one)
    tokens = chat(runner, ECHOES[0])
    on_tokens, finish = answer(keen(make_engine(drafting=ON)), tokens, temperature=0, max_tokens=32, record_logits=True)
    forced, forced_finish = answer(make_engine(), tokens, temperature=0, max_tokens=len(on_tokens),
                                   record_logits=True, forced_tokens=tuple(on_tokens))
    mean_kl, agree = compare(recorded[forced_finish.stats.request_id], recorded[finish.stats.request_id])
    assert mean_kl > 0.2 or not all(agree), f"the planted bug went unnoticed (mean KL {mean_kl})"


def test_sampled_answers_keep_their_distribution(runner, make_engine):
    """Each answer's tokens are sampled from the same rows with the same sampler as without guesses, so
    drafting moves the tokens' histogram over seeds no more than other seeds do. (The random stream is
    drawn once a token either way, but a drafted row's logits differ by llama.cpp's batch noise, up to
    ~0.6 here, which moves a sampled pick often enough that seeds part as answers run on.)"""
    tokens = chat(runner, ECHOES[1])

    def sample(drafting, seeds):
        engine = keen(make_engine(drafting=drafting))
        answers = [answer(engine, tokens, temperature=0.8, top_k=40, top_p=0.95, seed=seed, max_tokens=24)[0]
                   for seed in seeds]
        if drafting is not None:
            assert drafted(engine)[1] > 0, "nothing drafted was accepted"
        engine.stop()
        return answers, Counter(t for a in answers for t in a)

    def distance(p, q):
        n, m = sum(p.values()), sum(q.values())
        return 0.5 * sum(abs(p[t] / n - q[t] / m) for t in set(p) | set(q))

    off, off_counts = sample(None, range(12))
    on, on_counts = sample(ON, range(12))
    _, other_counts = sample(None, range(12, 24))
    assert distance(on_counts, off_counts) <= distance(other_counts, off_counts) + 0.05
    assert [a[0] for a in on] == [a[0] for a in off], "the first token (no guess before it) is each seed's own"


def test_a_grammar_holds_drafted_answers(runner, make_engine):
    """An enum's values echo the prompt: guesses the grammar refuses are never proposed, and the answer
    is valid JSON of the schema."""
    schema = {"type": "object", "properties": {"devices": {"type": "array", "items": {
        "type": "string", "enum": [d.strip() for d in DEVICES.split(",")]}, "minItems": 3, "maxItems": 6}},
              "required": ["devices"]}
    grammar = Grammar(runner.schema_converter.grammar(schema, "root"), param="response_format")
    engine = keen(make_engine(drafting=ON))
    out, finish = answer(engine, chat(runner, ECHOES[0] + " Answer in JSON."), temperature=0, max_tokens=120,
                         grammar=grammar)
    value = json.loads(runner.detokenize(out))
    assert 3 <= len(value["devices"]) <= 6 and finish.reason == "stop"
    assert drafted(engine)[1] > 0, "the device names were not drafted"


def test_a_stop_string_inside_accepted_guesses_ends_the_answer_there(runner, make_engine):
    engine = keen(keen(make_engine(drafting=ON, prompt_cache=True)), "bob")
    tokens = chat(runner, ECHOES[1])
    full, _ = answer(engine, tokens, temperature=0, max_tokens=48)
    stop = "Station Road"
    assert stop in runner.detokenize(full)
    events = list(engine.submit(list(tokens), lane="chat", member="bob",
                                params=SamplingParams(temperature=0, max_tokens=48, stop=(stop,))))
    finish, sent = events[-1], [e for e in events if isinstance(e, TokenEvent)]
    text = "".join(e.text for e in sent) + finish.text
    assert finish.reason == "stop" and text == runner.detokenize(full).split(stop)[0]
    assert finish.stats.output_tokens == len(sent), "a token past the stop was counted"
    assert drafted(engine, "bob")[1] > 0
    # the cells it left cached are what it computed: the same question again is read from them, answered alike
    again, finish_again = answer(engine, tokens, member="bob", temperature=0, max_tokens=48)
    assert finish_again.stats.cached_tokens > 0
    parted = next((i for i, (a, b) in enumerate(zip(again, full)) if a != b), None)
    assert parted is None or parted >= 16, (parted, runner.detokenize(again))


def test_an_abort_mid_draft_leaves_the_cache_as_the_scheduler_counts_it(runner, make_engine):
    engine = keen(make_engine(drafting=ON))
    tokens = chat(runner, ECHOES[0])
    stream = engine.submit(list(tokens), lane="chat", member="alice",
                           params=SamplingParams(temperature=0, max_tokens=200))
    seen = 0
    for event in stream:
        if isinstance(event, TokenEvent):
            seen += 1
            if seen == 12:
                engine.abort(stream.request.request_id)
    assert stream.finished.reason == "abort" and drafted(engine)[1] > 0
    assert all(cache.cells_used == 0 for cache in engine.state().caches.values())
    fresh, _ = answer(engine, tokens, member="bob", temperature=0, max_tokens=24)  # the abort's drops run first
    plain, _ = answer(make_engine(), tokens, member="bob", temperature=0, max_tokens=24)
    parted = next((i for i, (a, b) in enumerate(zip(fresh, plain)) if a != b), None)
    assert parted is None or parted >= 12, parted


def test_a_sliding_window_model_drafts_nothing_and_doctor_says_why(make_gemma_engine):
    from homeai import doctor
    from homeai.config import from_dict
    from tests.conftest import gemma_gguf, small_config

    engine = make_gemma_engine(drafting=ON)
    assert not engine.scheduler.drafting.settings.enabled
    said = doctor.facts(small_config(path=gemma_gguf()))["speculative"]
    assert said.startswith("off for this model: its sliding-window attention (512 tokens)"), said
    assert doctor.facts(small_config())["speculative"].startswith("on for chat, voice: up to 8 tokens")
    off = from_dict({"speculative": {"enabled": False}})
    assert doctor.facts(off)["speculative"] == "off ([speculative] enabled = false)"
