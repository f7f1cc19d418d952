"""A pattern's grammar is cheap to weigh by construction (issue 55): the rule of `homeai.tools.patterns`
refuses what makes llama.cpp read a token's characters in many ways at once (a repetition in a
repetition, an open choice in a repeated group, too many open repetitions, nested counts past
`max_repeat`), names the field, and takes what a household writes; on the real vocabulary, what it
takes weighs a token about as a plain pattern does, and what it refuses costs many times more.
Also: a huge tool list is refused on its count or size before any schema is validated.

Run: .venv/bin/python -m pytest tests/security/test_grammar_cost.py
"""

from __future__ import annotations

import pytest

from homeai import tools
from homeai.config import GrammarConfig
from homeai.llama import CONVERTER, json_schema_grammar
from homeai.tools import ToolError, response_format_grammar, spec
from homeai.tools.patterns import MAX_OPEN_REPEATS
from tests.security.weighing import Weigher

LIMITS = GrammarConfig()
ISSUE = "^(((((([a-z])+)+)+)+)+)+[a-z]{40}$"  # the issue's: ~8 s a token, passed every bound

REFUSED = {
    "the issue's": (ISSUE, "repetition in a repetition"),
    "nested plus": ("^(([a-z])+)+$", "written once"),
    "nested star after a const": ("^x([0-9]*)*y$", "may match nothing"),
    "nested count": ("^([a-z]{1,3}){1,3}$", "decided by the next character"),
    "exact count of a loop": ("^(a+){3}$", "decided by the next character"),
    "same first letter": ("^([a-df-z]|[a-df-z]|[a-df-z]|[a-df-z])+$", "same character"),
    "prefix alternatives": ("^(a|ab)+$", "same character"),
    "optional inside": ("^(aa?)+$", "could also come after it"),
    "empty alternative": ("^(a|)+$", "may match nothing"),
    "optional group repeated": ("^(a?){0,999}$", "may match nothing"),
    "counts as the converter reads them": ("^(a{,}){,}$", "may match nothing"),  # (a*)*, not text
    "open repetitions": ("^" + "[a-z]*" * (MAX_OPEN_REPEATS + 2) + "$", "open at once"),  # the last: the end decides
    "open optional letters": ("^" + "[a-z]?" * 50 + "$", "open at once"),  # minutes a token
    "count product": ("^((a{30}){30}){30}$", "max_repeat"),
    "deep groups": ("^" + "(" * 100 + "a" + ")" * 100 + "$", "groups"),
    "wide alternation": ("^(" + "|".join(f"w{i}" for i in range(LIMITS.max_enum + 1)) + ")$", "max_enum"),
}
# As llama.cpp reads them: no \\d, no \\. (the bounds take those too; llama.cpp refuses its grammar then).
TAKEN = ["^[a-z]+$", "^([0-9]{3}-)?[0-9]{4}$", "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "^[^@]+@[^@]+[.][a-z]{2,}$", "^.+@.+$",
         "^([a-z0-9-]+[.])+[a-z]{2,}$", "^([0-9]{1,3}[.]){3}[0-9]{1,3}$", "^([0-9]+,)*[0-9]+$", "^(ab?)+$", "^(x|y)*$",
         "^(cat|dog)+$", "^[A-Z][a-z]+( [A-Z][a-z]+)*$", "^" + "[a-z]*" * (MAX_OPEN_REPEATS + 1) + "$", "^.{2,20}$",
         "^[0-9]{1,2}:[0-9]{2}( ?[ap]m)?$", "^#[0-9a-fA-F]{6}$", "^[a-z]{2}[a-z]{3}[a-z]{4}[a-z]{5}[a-z]{6}$",
         "^" + "[a-z]+[0-9]+" * MAX_OPEN_REPEATS + "[a-z]+$", "^(" + "|".join("abcde") + ")+$",
         "^(" + "|".join(["[a-z]+"] * 8) + ")$", "^(a(b(c(d(e(f)?)?)?)?)?)?$", "^[a-z]?" + "[a-z]" * 20 + "$",
         "^([+]?1)?[0-9]{3}-?[0-9]{3}-?[0-9]{4}$"]


def schema_of(pattern: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}}}}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_costly_pattern_is_refused_naming_the_field(name):
    pattern, why = REFUSED[name]
    with pytest.raises(ToolError, match=why) as refused:
        response_format_grammar(schema_of(pattern), converter=CONVERTER)
    assert refused.value.param == "response_format.json_schema.schema.properties.x.pattern"
    assert len(str(refused.value)) < 500


@pytest.mark.parametrize("pattern", TAKEN)
def test_patterns_a_household_writes_are_taken(pattern):
    assert response_format_grammar(schema_of(pattern), converter=CONVERTER) is not None


@pytest.mark.parametrize("schema,field", [
    ({"type": "object", "patternProperties": {"^([a-z]+)+$": {"type": "string"}}}, ".patternProperties.^([a-z]+)+$"),
    ({"type": "object", "propertyNames": {"pattern": "^([a-z]+)+$"}}, ".propertyNames.pattern"),
    ({"type": "array", "items": {"type": "string", "pattern": "^([a-z]+)+$"}}, ".items.pattern"),
])
def test_every_pattern_in_a_schema_is_read(schema, field):
    with pytest.raises(ToolError) as refused:
        response_format_grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                                converter=CONVERTER)
    assert refused.value.param == "response_format.json_schema.schema" + field


# ---- what llama.cpp costs, on the real vocabulary ------------------------------------------------


@pytest.fixture(scope="module")
def weigh(runner):
    """CPU seconds to weigh a token of the whole vocabulary under a pattern's grammar, after `prefix`."""
    weigher = Weigher(runner)
    return lambda pattern, prefix: weigher.after(json_schema_grammar({"type": "string", "pattern": pattern}),
                                                 '"' + prefix)


@pytest.mark.model
def test_what_the_rule_takes_weighs_like_a_plain_pattern_and_what_it_refuses_does_not(weigh):
    plain = weigh("^[a-z]+$", "abc")
    taken = {p: weigh(p, prefix) for p, prefix in (("^([a-z0-9-]+[.])+[a-z]{2,}$", "abc.de"),
                                                   ("^" + "[a-df-z]*" * (MAX_OPEN_REPEATS + 1) + "$", "ab"),
                                                   ("^[^@]+@[^@]+[.][a-z]{2,}$", "ab@cd"), ("^([0-9]+,)*[0-9]+$", "12,3"))}
    assert all(t < 5 * plain + 0.05 for t in taken.values()), (plain, taken)  # measured: within 2x here
    # A repetition in a repetition, 4 deep (the issue's is 6: ~8 s), and an open choice in a repeated group:
    refused = {p: weigh(p, "aa") for p in ("^(((([a-z])+)+)+)+$", "^([a-df-z]|[a-df-z]|[a-df-z])+$")}
    assert all(t > 5 * plain for t in refused.values()), (plain, refused)  # measured: 25x and more here


# ---- cheap refusals first ------------------------------------------------------------------------


@pytest.fixture
def validations(monkeypatch):
    """How many times a JSON schema was validated against its metaschema."""
    calls = []
    real = spec._validator

    def counting(schema):
        calls.append(schema)
        return real(schema)

    monkeypatch.setattr(spec, "_validator", counting)
    return calls


def tool(i: int, description: str = "turns a light on") -> dict:
    return {"type": "function", "function": {"name": f"tool_{i}", "description": description, "parameters": {
        "type": "object", "properties": {"area": {"type": "string"}, "level": {"type": "integer"}}}}}


@pytest.mark.parametrize("listed,why", [
    ([tool(i) for i in range(2_800)], "max_enum"),  # the issue's 3.9 MB list: 75 s to refuse 4 of them
    ([tool(i, "x" * 10_000) for i in range(10)], "max_schema_bytes"),
])
def test_a_huge_tool_list_is_refused_before_any_schema_is_validated(validations, listed, why):
    plan = tools.plan(listed, None, template_source=None, converter=CONVERTER)
    with pytest.raises(ToolError, match=why) as refused:
        plan.grammar(LIMITS)
    assert refused.value.param == "tools"
    assert validations == []


def test_a_tool_list_within_the_limits_is_validated_tool_by_tool(validations):
    bad = {"type": "function", "function": {"name": "bad", "parameters": {"type": "object", "properties": {
        "a": {"type": 3}}}}}
    with pytest.raises(ToolError, match="not a valid JSON schema") as refused:
        tools.plan([tool(0), bad], None, template_source=None, converter=CONVERTER).grammar(LIMITS)
    assert refused.value.param == "tools.1.function.parameters"
    assert len(validations) == 2
