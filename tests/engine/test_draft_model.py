"""A draft model (`[speculative] draft_path`, `homeai.llama.draft_model`): it guesses where an answer's
own tokens guess nothing, and its guesses are checked as any guess is, so answers stay the model's.
The only offline models are SmolLM2 and Gemma 3, so SmolLM2 drafts for itself here: its guesses are
the served model's own greedy picks (but for batch noise), which checks the mechanism, not a speedup
(a draft model earns its keep when it is several times smaller, on a GPU)."""

from __future__ import annotations

import pytest

from homeai.config import ConfigError, from_dict
from homeai.engine.stream import FinishEvent, TokenEvent
from homeai.llama import RunnerError
from homeai.models import embedded_gguf
from homeai.sched.draft import Acceptance, DraftSettings
from homeai.sched.request import SamplingParams
from tests.conftest import _engines, gemma_gguf, small_config
from tests.engine.test_batching import compare
from tests.engine.test_drafting import recorded  # noqa: F401 (a fixture)

ON = DraftSettings(enabled=True, max_draft=6, lanes=frozenset({"chat"}), model=True)
STORY = "Tell me a short story about a lighthouse keeper and a storm."


def draft_config(draft: str):
    base = small_config()
    return from_dict({"model": {k: getattr(base.model, k) for k in ("n_ctx", "interactive_n_ctx", "n_seq_max", "n_batch",
                                                                     "n_threads", "embed_n_ctx", "embed_n_seq_max")},
                      "speculative": {"draft_path": draft}})


@pytest.fixture(scope="module")
def draft_runner():
    from homeai.app import load_runner

    loaded = load_runner(draft_config(str(embedded_gguf())), embeddings=False, grammar=False)
    yield loaded
    loaded.close()


@pytest.fixture
def make_draft_engine(draft_runner):
    yield from _engines(draft_runner)


def answer(engine, tokens, **params):
    events = list(engine.submit(list(tokens), lane="chat", member="alice", params=SamplingParams(**params)))
    assert isinstance(events[-1], FinishEvent)
    return [e.token for e in events if isinstance(e, TokenEvent)], events[-1]


def test_the_draft_model_guesses_what_the_prompt_cannot_and_answers_stay_the_models(
        draft_runner, make_draft_engine, recorded):  # noqa: F811
    tokens = draft_runner.tokenize(draft_runner.apply_chat_template([{"role": "user", "content": STORY}]))
    on = make_draft_engine(drafting=ON)
    with on.lock:  # guesses held so far: drafting pays whatever the box's load taught the cost model
        on.scheduler.drafting.pairs[("chat", "alice")] = Acceptance(accepted=[19.0, 19.0], trials=[20.0, 20.0])
    out, finish = answer(on, tokens, temperature=0, max_tokens=48, record_logits=True)
    pair = on.scheduler.drafting.pairs[("chat", "alice")]
    assert pair.drafted >= 10 and pair.accepted_total >= 0.7 * pair.drafted, (pair.drafted, pair.accepted_total)
    on.stop()
    off = make_draft_engine()
    forced, forced_finish = answer(off, tokens, temperature=0, max_tokens=len(out), record_logits=True,
                                   forced_tokens=tuple(out))
    mean_kl, agree = compare(recorded[forced_finish.stats.request_id], recorded[finish.stats.request_id])
    assert mean_kl < 0.02 and agree and all(agree), (mean_kl, agree)


def test_a_draft_model_with_another_vocabulary_stops_the_start():
    from homeai.app import load_runner

    with pytest.raises(RunnerError, match="has another vocabulary than the served model"):
        load_runner(draft_config(gemma_gguf()), embeddings=False, grammar=False)


def test_a_draft_path_naming_nothing_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="speculative.draft_path names no file and no local model"):
        from_dict({"speculative": {"draft_path": str(tmp_path / "nothing.gguf")}})


def test_doctor_names_the_draft_model():
    from homeai import doctor

    said = doctor.facts(draft_config(str(embedded_gguf())))["speculative"]
    assert "else by the draft model" in said and str(embedded_gguf()) in said
