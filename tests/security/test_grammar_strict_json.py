"""Strict JSON holds (issue 26): with `json_schema`, every reply that ends with `stop` parses with
Python's strict `json.loads`. llama-cpp-python's converter let a string's `char` be any byte but `"`
and `\\`, so a raw newline or tab could stand inside a string; homeai's grammars refuse raw
control characters in strings (`runner.strict_strings`), as llama.cpp's own converter does.

Run: .venv/bin/python -m pytest tests/security/test_grammar_strict_json.py
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from homeai.engine.runner import grammar_sampler, json_schema_grammar
from homeai.sched.request import Grammar
from tests.api.conftest import TIMEOUT, add_token, api_config, serve

pytestmark = pytest.mark.model

SEEDS = range(24)
TEXT = {"type": "string", "maxLength": 60}
SCHEMAS = {
    "poem": {"type": "object", "properties": {"title": TEXT, "lines": {"type": "array", "items": TEXT, "maxItems": 4}},
             "required": ["title", "lines"]},
    "note": {"type": "object", "properties": {"to": TEXT, "body": {"type": "string", "maxLength": 120},
                                              "urgent": {"type": "boolean"}}, "required": ["to", "body"]},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^.{1,24}$"},
                                                 "other": {"type": "string", "pattern": "^[^x]{1,12}$"}},
                "required": ["code", "other"]},
    "list": {"type": "array", "items": {"type": "object", "properties": {"item": TEXT, "qty": {"type": "integer"}},
                                        "required": ["item"]}, "minItems": 1, "maxItems": 3},
}
ASK = ("Write it as JSON, with line breaks\nand tabs\tinside the strings, quotes \" and backslashes \\ too, "
       "like a poem or a letter.")


def tokens_for(runner, pieces: list[bytes]) -> dict[bytes, int]:
    """A token whose text is exactly each of `pieces`, where the vocabulary has one."""
    wanted, found = set(pieces), {}
    for token in range(runner.n_vocab):
        piece = runner.piece(token)
        if piece in wanted and piece not in found:
            found[piece] = token
    return found


def inside_the_string(schema: dict) -> str:
    """The GBNF of a string schema from inside its quotes on: what the model may write there."""
    text = json_schema_grammar(schema)
    root = next(line for line in text.splitlines() if line.startswith("root ::= "))
    body = root.removeprefix("root ::= ")
    assert body.startswith('"\\"" ') and body.endswith(' "\\"" space'), root
    return text.replace(root, "root ::= " + body[len('"\\"" '):-len(' "\\"" space')])


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "string", "pattern": "^.+$"},
                                    {"type": "string", "pattern": "^[^a]+$"}, {"type": "string", "pattern": "^[ -~]+$"},
                                    {"type": "string", "pattern": '^[\\x00-\\x7F"]+$'}])
def test_a_string_refuses_raw_control_characters(runner, schema):
    """Inside a string the grammar takes letters (and escapes), never a raw newline, tab, other control
    byte or quote: not `char` (the converter's let any byte but `"` and `\\` through), not a pattern's
    `.`, negated or own class."""
    sampler = grammar_sampler(runner.vocab, Grammar(inside_the_string(schema)))
    assert sampler, inside_the_string(schema)
    found = tokens_for(runner, [b"\n", b"\t", b"\r", b"b", b'"'])
    assert {b"\n", b"b", b'"'} <= set(found)
    allowed = {piece: runner.candidates.allows(sampler, token) for piece, token in found.items()}
    assert allowed[b"b"]
    assert not any(allowed.get(p) for p in (b"\n", b"\t", b"\r", b'"')), allowed


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp)


@pytest.fixture(scope="module")
def client(cfg, runner):
    with serve(cfg, runner) as server, openai.OpenAI(base_url=f"{server.url}/v1", api_key=add_token(cfg, "alice"),
                                                     timeout=TIMEOUT, max_retries=0) as c:
        yield c


def ask(client, name: str, seed: int):
    reply = client.chat.completions.create(
        model="homeai", messages=[{"role": "user", "content": f"{name}: {ASK}"}], temperature=1.0, seed=seed,
        max_tokens=120, response_format={"type": "json_schema", "json_schema": {
            "name": name, "schema": SCHEMAS[name], "strict": True}})
    return reply.choices[0]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_reply_that_stops_is_strict_json(client, name):
    with ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(lambda seed: ask(client, name, seed), SEEDS))
    stopped = [c.message.content for c in choices if c.finish_reason == "stop"]
    assert stopped, [c.finish_reason for c in choices]
    for content in stopped:
        value = json.loads(content)  # strict: a raw control character inside a string fails here
        if name != "pattern":  # the converter's patterns are looser than their regexes
            jsonschema.validate(value, SCHEMAS[name])
