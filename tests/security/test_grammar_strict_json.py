"""Strict JSON holds (issue 26): with `json_schema`, every reply that ends with `stop` parses with
Python's strict `json.loads`. llama-cpp-python's converter let a string's `char` be any byte but `"`
and `\\`, so a raw newline or tab could stand inside a string; homeai's grammars refuse raw
control characters in strings (`runner.strict_strings`), as llama.cpp's own converter does. Its
literals were not JSON either: a pattern's literal text (`^say "hi"$`) went raw into the string, and a
`const`/`enum` value or property name with a backslash or quote made the wrong value or a broken
grammar; homeai's converter (`runner._JsonConverter`) writes each literal as JSON text holds it.

Run: .venv/bin/python -m pytest tests/security/test_grammar_strict_json.py
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import llama_cpp as ll
import openai
import pytest

from homeai.llama.grammar import json_schema_grammar
from homeai.llama.sampling import grammar_sampler
from homeai.sched.request import Grammar
from tests.api.conftest import TIMEOUT, add_token, api_config, serve

pytestmark = pytest.mark.model

SEEDS = range(12)  # 12 seeds x 5 schemas: 60 sampled replies
TEXT = {"type": "string", "maxLength": 60}
SCHEMAS = {
    "poem": {"type": "object", "properties": {"title": TEXT, "lines": {"type": "array", "items": TEXT, "maxItems": 4}},
             "required": ["title", "lines"]},
    "note": {"type": "object", "properties": {"to": TEXT, "body": {"type": "string", "maxLength": 120},
                                              "urgent": {"type": "boolean"}}, "required": ["to", "body"]},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^.{1,24}$"},
                                                 "other": {"type": "string", "pattern": "^[^x]{1,12}$"}},
                "required": ["code", "other"]},
    "quotes": {"type": "object", "properties": {
        "said": {"type": "string", "pattern": '^say "[a-z]{1,8}"$'},
        "path": {"type": "string", "pattern": "^C:\\\\[a-z]{1,8}\\\\\\\\x$"},
        "mood": {"enum": ['a "good" one', "back\\slash", "two\nlines"]}, 'say "it"': {"const": "\\\""}},
        "required": ["said", "path", "mood", 'say "it"']},
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
    allowed = {piece: runner.sampler.candidates.allows(sampler, token) for piece, token in found.items()}
    assert allowed[b"b"]
    assert not any(allowed.get(p) for p in (b"\n", b"\t", b"\r", b'"')), allowed


def takes(runner, grammar: str, text: str) -> bool:
    """The grammar takes `text` whole: each of its tokens, then the end of the reply."""
    sampler = grammar_sampler(runner.vocab, Grammar(grammar))
    assert sampler, grammar
    try:
        for token in runner.tokenize(text, add_special=False):
            if not runner.sampler.candidates.allows(sampler, token):
                return False
            ll.llama_sampler_accept(sampler, token)
        return runner.sampler.candidates.allows(sampler, ll.llama_vocab_eos(runner.vocab))
    finally:
        ll.llama_sampler_free(sampler)


LITERALS = [  # (schema, a value it holds, that value written raw): the grammar takes the value's JSON only
    ({"type": "string", "pattern": '^say "hi"$'}, 'say "hi"', '"say "hi""'),
    ({"type": "string", "pattern": "^a\\\\b$"}, "a\\b", '"a\\b"'),
    ({"type": "string", "pattern": "^a\\\\\\\\b$"}, "a\\\\b", '"a\\\\b"'),
    ({"type": "string", "pattern": '^(\\"|x)+y\\x22\\u00fc$'}, 'x""y"ü', '"x""y"ü"'),
    ({"type": "string", "pattern": "^tab\\tand\\n$"}, "tab\tand\n", '"tab\tand\n"'),
    ({"const": 'say "hi" \\ ü'}, 'say "hi" \\ ü', '"say "hi" \\ ü"'),
    ({"enum": ['a"b', "c\\\\d", "e\nf"]}, 'a"b', '"a"b"'),
    ({"enum": ['a"b', "c\\\\d", "e\nf"]}, "c\\\\d", '"c\\\\d"'),
    ({"enum": ['a"b', "c\\\\d", "e\nf"]}, "e\nf", '"e\nf"'),
    ({"type": "object", "properties": {'a"b\\': {"type": "integer"}}, "required": ['a"b\\']}, {'a"b\\': 1},
     '{"a"b\\": 1}'),
]


@pytest.mark.parametrize(("schema", "value", "raw"), LITERALS, ids=[repr(value) for _, value, _ in LITERALS])
def test_a_literal_with_a_quote_or_backslash_is_written_as_json(runner, schema, value, raw):
    """A quote, backslash or control character in a pattern's literal text, a const, an enum value
    or a property name: the grammar takes the value's JSON (`\\"`, `\\\\`, `\\n`) and not the raw text,
    which the converter's own literals held (or the wrong value, or a grammar llama.cpp refused)."""
    jsonschema.validate(value, schema)
    grammar = json_schema_grammar(schema)
    assert takes(runner, grammar, json.dumps(value, ensure_ascii=False)), grammar
    assert not takes(runner, grammar, raw), grammar


def test_a_pattern_llama_cpp_cannot_read_is_still_refused(runner):
    """An escape llama.cpp does not know (`\\d`) is left in the literal, so the grammar is refused
    (a 400) rather than written as something the pattern did not say."""
    grammar = json_schema_grammar({"type": "string", "pattern": '^"\\d$'})
    assert '"\\"\\d"' in grammar
    assert not grammar_sampler(runner.vocab, Grammar(grammar))


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
