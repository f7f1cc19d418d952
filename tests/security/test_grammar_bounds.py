"""Grammars that cannot hurt the box (issue 26): a schema or tool whose grammar would be too large or
too slow to build or sample is a 400 naming the field, on every path (`/v1` response_format and
tools, `/v1/completions`, Ollama `format` and tools, the voice socket's tools), before anything
reaches the engine; llama.cpp first builds a new grammar in the checker's process (a crash or a
timeout there refuses the grammar, not the daemon); a refusal is logged in one short line. Issue 55:
the nested-quantifier pattern behind a `const` is refused on every path too, and a 3.8 MB list of
2,800 tools is a 400 naming `tools` before any of its schemas is validated.

Run: .venv/bin/python -m pytest tests/security/test_grammar_bounds.py
"""

from __future__ import annotations

import ctypes
import json
import logging

import numpy as np
import pytest

from homeai.config import GrammarConfig
from homeai.engine.grammar_check import GrammarChecker
from homeai.llama.grammar import CONVERTER, json_schema_grammar
from homeai.llama.sampling import WEIGHED_FIRST, allowed_needed, grammar_sampler
from homeai.sched.request import Grammar, SamplingParams
from homeai.tools import ToolError, bounds, response_format_grammar, spec
from tests.security.conftest import assert_refused, event, post_json, until, voice_socket

LIMITS = GrammarConfig()
INTS = {"type": "array", "items": {"type": "integer"}}


def doubling(levels: int) -> dict:
    """A small schema whose `$ref`s double the alternatives at each level: 2**levels in all."""
    defs = {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"$ref": f"#/$defs/a{i + 1}"}]} for i in range(levels)}
    return {"$defs": {**defs, f"a{levels}": {"type": "string"}}, "type": "object",
            "properties": {"x": {"$ref": "#/$defs/a0"}}}


# Each schema the issue's probe crashed or stalled the daemon with, and the field its refusal names.
REFUSED = {
    "maxItems": ({**INTS, "maxItems": 100_000}, ".maxItems"),
    "maxLength": ({"type": "string", "maxLength": 1_000_000}, ".maxLength"),
    "minLength": ({"type": "string", "minLength": 1_000_000}, ".minLength"),
    "20,000": ({"type": "string", "maxLength": 20_000}, ".maxLength"),
    "nested": ({"type": "object", "properties": {"tags": {**INTS, "minItems": 5000}}}, ".properties.tags.minItems"),
    "pattern": ({"type": "string", "pattern": "^a{0,5000}$"}, ".pattern"),
    "optional group repeated": ({"type": "string", "pattern": "^(a?){0,999}$"}, ".pattern"),
    "enum": ({"enum": [f"choice number {i}" for i in range(50_000)]}, ""),  # larger than max_schema_bytes
    "wide enum": ({"enum": [f"c{i}" for i in range(LIMITS.max_enum + 1)]}, ".enum"),
    "anyOf": ({"anyOf": [{"const": i} for i in range(LIMITS.max_enum + 1)]}, ".anyOf"),
    "doubling refs": (doubling(22), ""),
    "deep": (json.loads('{"type": "array", "items": ' * 40 + "{}" + "}" * 40), ".items" * 33),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_schema_past_the_bounds_is_refused_naming_the_field(name):
    schema, field = REFUSED[name]
    with pytest.raises(ToolError) as refused:
        response_format_grammar({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                                converter=CONVERTER)
    where = "response_format.json_schema.schema"
    assert refused.value.param.startswith(where + field), refused.value.param
    assert len(str(refused.value)) < 400


def test_the_bounds_come_from_the_config():
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {**INTS, "maxItems": 50}}}
    assert response_format_grammar(schema, converter=CONVERTER) is not None
    with pytest.raises(ToolError, match="max_repeat"):
        response_format_grammar(schema, GrammarConfig(max_repeat=10), converter=CONVERTER)


def test_usual_schemas_pass_the_bounds():
    """Bounds a household's schemas stay well within: Home Assistant's tools, a date pattern, a tree."""
    node = {"type": "object", "properties": {"name": {"type": "string"}, "children": {
        "type": "array", "items": {"$ref": "#/definitions/node"}, "maxItems": 5}}}
    tree = {"definitions": {"node": node}, "type": "object", "properties": {"root": {"$ref": "#/definitions/node"}}}
    for schema in (tree, {"type": "string", "pattern": "^(\\d{3}-)?\\d{4}$"}, {**INTS, "maxItems": 1000},
                   {"enum": [f"c{i}" for i in range(LIMITS.max_enum)]}):
        bounds.check_schema(schema, "s", LIMITS)
        bounds.check_gbnf(json_schema_grammar(schema), "s", LIMITS)


def test_groups_nested_too_deep_for_the_parser_are_refused():
    deep = "root ::= " + "(" * 3000 + '"a"' + ")" * 3000
    with pytest.raises(ToolError, match="nest"):
        bounds.check_gbnf(deep, "format", LIMITS)
    assert bounds.group_depth('root ::= ("(" [(] ("a")) # ((\n') == 2


# ---- the checker's process ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def checker(runner):
    made = GrammarChecker(runner.info.path)
    yield made
    made.stop()


def test_a_grammar_that_crashes_llama_cpp_crashes_only_the_checker(checker):
    # 20,000 nested groups overflow llama.cpp's recursive parser (the issue's segfault).
    crashing = "root ::= " + "(" * 20_000 + '"a"' + ")?" * 20_000
    assert "failed" in checker.check(crashing, "root", 30.0)
    assert checker.check('root ::= "yes" | "no"', "root", 30.0) is None  # a new checker answers


def test_a_grammar_llama_cpp_refuses_gets_its_reason_in_a_line(checker):
    reason = checker.check("root ::= undefined-rule " + "x" * 100_000, "root", 30.0)
    assert reason and len(reason) < 300 and "\n" not in reason


def test_a_grammar_too_slow_to_build_or_weigh_is_refused_within_the_ceiling(checker):
    # A repeated optional group (which the bounds refuse before any build): llama.cpp weighs every
    # split of the text between rounds, seconds a token on this box.
    slow = json_schema_grammar({"type": "string", "pattern": "^(a?){0,999}$"})
    reason = checker.check(slow, "root", 0.5)
    assert reason and "more than 0.5 s" in reason
    assert checker.check(slow, "root", 0.5) == reason  # kept: asked again, answered at once
    assert checker.check('root ::= "ok"', "root", 30.0) is None


# ---- every path, against a live server ------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "Hi"}]
HUGE = {**INTS, "maxItems": 100_000}
# The issue's pattern, behind a const property (which kept the grammar checker's first tokens away from it).
NESTED = {"type": "object", "properties": {"k": {"const": "v"}, "x": {
    "type": "string", "pattern": "^(((((([a-z])+)+)+)+)+)+[a-z]{40}$"}}, "required": ["k", "x"]}
SCHEMAS = {"unbounded": (HUGE, ".maxItems"), "nested pattern": (NESTED, ".properties.x.pattern")}


def as_tools(schema: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": schema}}}}]


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# Each path a schema enters by: (path, body, the field its refusal names before the schema's own part)
V1 = {
    "chat response_format": lambda s: ("/v1/chat/completions", {"messages": MESSAGES, "response_format": json_schema(s)},
                                       "response_format.json_schema.schema"),
    "chat tools": lambda s: ("/v1/chat/completions", {"messages": MESSAGES, "tools": as_tools(s)},
                             "tools.0.function.parameters.properties.x"),
    "completions": lambda s: ("/v1/completions", {"prompt": "Hi", "response_format": json_schema(s)},
                              "response_format.json_schema.schema"),
}
OLLAMA = {
    "chat format": lambda s: ("/api/chat", {"messages": MESSAGES, "format": s}, "format"),
    "chat tools": lambda s: ("/api/chat", {"messages": MESSAGES, "tools": as_tools(s)},
                             "tools.0.function.parameters.properties.x"),
    "generate format": lambda s: ("/api/generate", {"prompt": "Hi", "format": s}, "format"),
}


@pytest.mark.model
@pytest.mark.parametrize("schema", sorted(SCHEMAS))
@pytest.mark.parametrize("name", sorted(V1))
def test_v1_refuses_an_unbounded_schema_naming_the_field(http, name, schema):
    value, field = SCHEMAS[schema]
    path, body, param = V1[name](value)
    assert_refused(post_json(http, path, {"model": "homeai", **body}), param=param + field)


@pytest.mark.model
@pytest.mark.parametrize("schema", sorted(SCHEMAS))
@pytest.mark.parametrize("name", sorted(OLLAMA))
def test_ollama_refuses_an_unbounded_schema_naming_the_field(http, name, schema):
    value, field = SCHEMAS[schema]
    path, body, param = OLLAMA[name](value)
    response = post_json(http, path, {"model": "homeai", "stream": False, **body})
    assert response.status_code == 400, response.text[:300]
    assert param + field in response.json()["error"]


@pytest.mark.model
@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_the_voice_socket_refuses_such_tools_at_session_start(server, token, schema):
    value, field = SCHEMAS[schema]
    with voice_socket(server, token) as ws:
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000, "tools": as_tools(value)}))
        error = until(ws, "error", "session.ready")[-1]
        assert error["type"] == "error" and error["code"] == "invalid_tools", error
        assert "tools.0.function.parameters.properties.x" + field in error["message"]
        ws.send(json.dumps({"type": "session.start", "sample_rate": 16000}))
        assert event(ws)["type"] == "session.ready"  # the socket is still there


@pytest.mark.model
def test_a_huge_tool_list_is_a_400_naming_tools_before_any_schema_is_validated(http, monkeypatch):
    """The issue's 3.9 MB list (2,800 tools, within the 4 MB body limit): refused on its count."""
    validated = []
    real = spec._validator
    monkeypatch.setattr(spec, "_validator", lambda schema: validated.append(schema) or real(schema))
    listed = [{"type": "function", "function": {"name": f"t{i}", "description": "d" * 600, "parameters": {
        "type": "object", "properties": {"area": {"type": "string", "description": "a" * 600}}}}} for i in range(2_800)]
    response = post_json(http, "/v1/chat/completions", {"model": "homeai", "messages": MESSAGES, "tools": listed})
    assert_refused(response, param="tools")
    assert "max_enum" in response.json()["error"]["message"]
    assert validated == []


@pytest.mark.model
def test_a_refused_grammar_is_one_short_log_line_and_the_daemon_answers_on(http, caplog, capfd):
    capfd.readouterr()
    with caplog.at_level(logging.INFO, logger="homeai.tools"):
        # One past the bounds; one llama.cpp itself refuses (the converter passes `\d` on, which it does
        # not know), which it used to write out whole to stderr.
        for schema in (HUGE, {**INTS, "maxItems": 1000, "items": {"type": "string", "pattern": "^\\d{3}$"}}):
            response = post_json(http, "/v1/chat/completions", {"model": "homeai", "messages": MESSAGES,
                                                                "response_format": {"type": "json_schema", "json_schema": {
                                                                    "name": "x", "schema": schema}}})
            assert_refused(response)
    refusals = [r.getMessage() for r in caplog.records if r.name == "homeai.tools"]
    assert len(refusals) == 2 and all(len(line) < 500 and "\n" not in line for line in refusals), refusals
    out, err = capfd.readouterr()
    assert len(out) + len(err) < 5000  # no grammar dumped
    ok = post_json(http, "/v1/chat/completions", {"model": "homeai", "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {**INTS, "maxItems": 3}}}})
    assert ok.status_code == 200, ok.text[:300]


# ---- sampling: the best-scored tokens weighed first ----------------------------------------------


def allowed_top(data, size: int, k: int) -> list[int]:
    """The ids of the k best-scored allowed tokens among the first `size` of a candidate array."""
    rows = data[:size][np.isfinite(data["logit"][:size])]
    return [int(i) for i in rows["id"][np.argsort(-rows["logit"], kind="stable")][:k]]


@pytest.mark.model
def test_weighing_the_best_tokens_first_picks_what_the_whole_vocabulary_would(runner):
    """A pick the grammar refuses is made again among the best 256 tokens the grammar allows when that
    gives the chain's pick among all it allows (greedy: the best allowed; top_k: the same k); weighing
    the whole vocabulary against a 256-value enum took ~0.4-1 s a token on this box, the best 256 ~1%."""
    import llama_cpp as ll

    grammar = grammar_sampler(runner.vocab, Grammar("root ::= [a-z]+ | [0-9]+"))
    candidates, rng = runner.sampler.candidates, np.random.default_rng(3)
    for _ in range(5):
        logits = rng.normal(size=runner.n_vocab).astype(np.float32)
        whole = candidates.fill(logits)
        ll.llama_sampler_apply(grammar, ctypes.byref(whole))
        expected = allowed_top(candidates.data, whole.size, 40)
        assert len(expected) == 40
        best = candidates.top_allowed(logits, grammar, WEIGHED_FIRST, 40)
        assert best is not None and allowed_top(candidates.data, best.size, 40) == expected
    nothing = grammar_sampler(runner.vocab, Grammar('root ::= "zzzzzzzz" "q"'))
    assert candidates.top_allowed(logits, nothing, WEIGHED_FIRST, 1) is None  # rarely among the best: the whole vocabulary then
    assert allowed_needed(SamplingParams(temperature=0)) == 1
    assert allowed_needed(SamplingParams(temperature=0.8, top_k=40)) == 40
    assert allowed_needed(SamplingParams(temperature=0.8, top_k=0)) == 0  # any allowed token may be drawn
    assert allowed_needed(SamplingParams(temperature=0, repeat_penalty=1.1)) == 0
