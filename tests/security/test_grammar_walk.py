"""The grammar checker walks where the cost is (issue 55, point 1): it walked 4 tokens, so a leading
`const` property kept it away from a nested-quantifier pattern that then weighed each token for ~8 s
in the shared step. Now each walk goes on to the grammar's end (toward what closes a string or a
container, or the longest token), every token weighed against the whole vocabulary and timed in CPU
time: one past `[grammar] max_token_ms` refuses it. The grammars here reach llama.cpp directly (the
bounds would refuse the nested patterns first: this is the checker's own net)."""

from __future__ import annotations

import pytest

from homeai.config import GrammarConfig
from homeai.engine.grammar_check import GrammarChecker
from homeai.llama import json_schema_grammar

pytestmark = pytest.mark.model

LIMITS = GrammarConfig()
NESTED = "^(((((([a-z])+)+)+)+)+)+[a-z]{40}$"  # the issue's pattern
LONG_CONST = "a constant value long enough that four tokens never reach past it"


def behind_a_const(pattern: str) -> str:
    return json_schema_grammar({"type": "object", "properties": {"kind": {"const": LONG_CONST},
                                                                 "x": {"type": "string", "pattern": pattern}},
                                "required": ["kind", "x"]})


@pytest.fixture(scope="module")
def checker(runner):
    made = GrammarChecker(runner.info.path, max_token_ms=LIMITS.max_token_ms)
    yield made
    made.stop()


def test_the_issues_pattern_behind_a_const_is_refused(checker):
    reason = checker.check(behind_a_const(NESTED), "root", LIMITS.build_timeout_s)
    assert reason and reason.startswith("llama.cpp took"), reason


def test_one_costly_token_refuses_a_grammar_past_max_token_ms(runner):
    """A lower limit (the nested pattern two levels shallower, depth 4, weighs ~1 s a token here, ~4 ms
    before it) names the setting."""
    strict = GrammarChecker(runner.info.path, max_token_ms=40.0)
    try:
        reason = strict.check(behind_a_const("^(((([a-z])+)+)+)+[a-z]{40}$"), "root", 30.0)
    finally:
        strict.stop()
    assert reason and "max_token_ms" in reason and "at most 40 ms" in reason, reason


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name"]},
    {"type": "object", "properties": {"name": {"enum": ["HassTurnOn", "HassTurnOff", "HassLightSet"]},
                                      "arguments": {"type": "object", "properties": {
                                          "area": {"type": "string"}, "brightness": {"type": "integer"},
                                          "domain": {"type": "array", "items": {"enum": ["light", "fan", "cover"]}}}}},
     "required": ["name", "arguments"]},
    {"type": "object", "properties": {"entity": {"enum": [f"light.room_{i}_lamp" for i in range(LIMITS.max_enum)]}}},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}, "n": {"type": "number"}}},
], ids=["plain", "tool call", "widest enum", "date-time"])
def test_usual_schemas_pass_the_walk(checker, schema):
    assert checker.check(json_schema_grammar(schema), "root", LIMITS.build_timeout_s) is None
