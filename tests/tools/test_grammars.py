"""Each family's grammar in llama.cpp itself (over SmolLM2's vocabulary: the markup is text to it,
which the grammar matches as a real model's control tokens are matched, by their text): it parses,
and calls written in the family's form are taken token by token, the lazy grammar starting at the
call's opening and holding the rest. (tests/api/test_tool_triggers.py checks that no other text
starts a grammar.)

Run: .venv/bin/python -m pytest tests/tools/test_grammars.py
"""

from __future__ import annotations

import json

import llama_cpp as ll
import pytest

from homeai.llama.sampling import grammar_sampler
from homeai.tools.formats import Gemma, Gemma4, Generic, Granite, Harmony, Hermes, Llama3, Mistral, Phi4, QwenXML
from tests.tools.replies import plan_for

pytestmark = pytest.mark.model

# (format, template source picking its variant, text the model may write before a call)
FORMS = [(Generic, None, ""), (Hermes, None, "Sure.\n"), (QwenXML, None, "On it.\n"), (Llama3, None, ""),
         (Mistral, None, ""), (Mistral, "[ARGS]", ""), (Granite, None, "Okay. "), (Phi4, None, "Okay. "),
         (Gemma, None, ""), (Gemma4, None, "Turning it on."),
         (Harmony, None, "<|channel|>analysis<|message|>The user wants the light dimmed.<|end|><|start|>assistant")]
IDS = [f"{fmt.name}{'-named' if source else ''}" for fmt, source, _ in FORMS]

# Arguments in the order the grammars hold them to (a schema's required properties first, as
# llama.cpp's converter orders them), each JSON type once.
CALLS = [{"name": "intent__HassLightSet",
          "arguments": {"brightness": 40, "name": "kitchen light", "color": "warm white"}},
         {"name": "climate__SetTemperature",
          "arguments": {"temperature": 20.5, "away": False, "schedule": {"from": "07:00", "to": "22:00"}}},
         {"name": "homeassistant__GetLiveContext", "arguments": {}}]


def written(plan, calls: list[dict]) -> str:
    if isinstance(plan.format, Generic):
        return json.dumps({"tool_calls": calls})
    return plan.format.write([{"id": None, **c} for c in calls])


def taken(runner, grammar, text: str) -> tuple[int, int, bool]:
    """How many of `text`'s tokens the grammar takes, one by one, of how many; and whether it then
    refuses more text (it holds the reply: it started)."""
    sampler = grammar_sampler(runner.vocab, grammar)
    assert sampler, "llama.cpp parses the grammar"
    tokens = runner.tokenize(text, add_special=False)
    try:
        for i, token in enumerate(tokens):
            if not runner.sampler.candidates.allows(sampler, token):  # as the sampler chain does: never picked
                return i, len(tokens), False
            ll.llama_sampler_accept(sampler, token)
        holds = not runner.sampler.candidates.allows(sampler, runner.tokenize(" Hello", add_special=False)[0])
        return len(tokens), len(tokens), holds
    finally:
        ll.llama_sampler_free(sampler)


NAMED = {"type": "function", "function": {"name": "intent__HassLightSet"}}


@pytest.mark.parametrize("choice,parallel", [(None, True), ("required", False), (NAMED, True)])
@pytest.mark.parametrize("fmt,source,_before", FORMS, ids=IDS)
def test_every_forms_grammar_parses_in_llama_cpp(runner, fmt, source, _before, choice, parallel):
    grammar = plan_for(fmt, source, choice, parallel).grammar()
    assert grammar.lazy == (choice is None)
    assert runner.grammar_ok(grammar)


@pytest.mark.parametrize("fmt,source,before", FORMS, ids=IDS)
def test_a_call_in_the_form_is_taken_whole_by_the_lazy_grammar_which_then_holds_the_reply(runner, fmt, source, before):
    plan = plan_for(fmt, source)
    for calls in (CALLS[:1], CALLS) if fmt is not Harmony else (CALLS[:1],):  # harmony: one call, then <|call|>
        text = before + written(plan, calls)
        took, of, holds = taken(runner, plan.grammar(), text)
        assert took == of and holds, (text, took, of)
        assert [(c.name, c.arguments) for c in plan.parse(text).calls] == [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("fmt,source,_before", FORMS, ids=IDS)
def test_a_forced_call_is_taken_from_the_first_token(runner, fmt, source, _before):
    plan = plan_for(fmt, source, "required", parallel=False)
    text = written(plan, CALLS[1:2])
    took, of, holds = taken(runner, plan.grammar(), text)
    assert took == of and holds, (text, took, of)
