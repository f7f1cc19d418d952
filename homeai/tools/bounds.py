"""What a JSON schema may ask of a grammar, checked before any grammar is built.

llama-cpp-python's converter writes a bounded repetition (`maxItems`, `maxLength`, a pattern's
`{m,n}`) as that many nested groups, and llama.cpp parses nested groups recursively: 20,000 of
them overflowed the stack and killed the process. An `enum` of 50,000 strings is a grammar
whose every token weighs 50,000 alternatives against the whole vocabulary. So a schema (or a
request's tools, all together) is refused, with a `ToolError` naming the field at fault
(`response_format.json_schema.schema.properties.tags.maxItems`), when it is larger than
`[grammar] max_schema_bytes`, nested deeper than `MAX_DEPTH`, asks for a repetition past
`max_repeat`, or offers more than `max_enum` alternatives in one place; a `pattern` (or a
`patternProperties` key) whose grammar is not cheap to weigh by construction (`homeai.tools.patterns`:
no choice in a repeated group left open past the next character); the GBNF it becomes, when it is
larger than `max_grammar_bytes` or nests its groups deeper than `MAX_GROUP_DEPTH`.
What is left (the build's and the first tokens' time) is measured by `homeai.engine.grammar_check`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from homeai.config import GrammarConfig
from homeai.tools import patterns
from homeai.tools.spec import ToolError

MAX_DEPTH = 32  # schema objects within each other: a JSON answer nested deeper is no answer for a person
MAX_GROUP_DEPTH = 2_500  # parenthesised groups within each other in the GBNF (llama.cpp parses them recursively)
COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minContains",
          "maxContains")
ALTERNATIVES = ("enum", "anyOf", "oneOf", "allOf", "prefixItems", "type")
NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def check_size(value: Any, where: str, limits: GrammarConfig) -> None:
    """Refuse a schema (or a request's tools) larger than `max_schema_bytes` as compact JSON."""
    try:
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    except (RecursionError, ValueError):
        raise ToolError("is nested too deeply", where) from None
    if size > limits.max_schema_bytes:
        raise ToolError(f"is {size} bytes as JSON; at most {limits.max_schema_bytes} are taken "
                        "(the [grammar] max_schema_bytes setting)", where)


def check_schema(schema: Any, where: str, limits: GrammarConfig) -> None:
    """Refuse a schema whose grammar would be too large or too slow (see the module's docstring)."""
    check_size(schema, where, limits)
    _walk(schema, where, limits, 0)
    width = Widths(schema, limits.max_enum).of(schema)
    if width > limits.max_enum:
        raise ToolError(f"offers more than {limits.max_enum} alternatives at one place, its references followed "
                        "(the [grammar] max_enum setting)", where)


def _walk(node: Any, where: str, limits: GrammarConfig, depth: int) -> None:
    if not isinstance(node, (dict, list)):
        return
    if depth > MAX_DEPTH:
        raise ToolError(f"the schema nests more than {MAX_DEPTH} levels", where)
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, f"{where}.{i}", limits, depth + 1)
        return
    _check_node(node, where, limits)
    for key, value in node.items():
        if key in ("enum", "const", "default", "examples"):
            continue  # values, not schemas
        if key in NESTED_MAPS and isinstance(value, dict):
            if len(value) > limits.max_enum:
                raise ToolError(_too_many(len(value), key, limits), f"{where}.{key}")
            for name, sub in value.items():
                _walk(sub, f"{where}.{key}.{name}", limits, depth + 1)
        else:
            _walk(value, f"{where}.{key}", limits, depth + 1)


def _check_node(node: dict, where: str, limits: GrammarConfig) -> None:
    for key in COUNTS:
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limits.max_repeat:
            raise ToolError(f"{key} {value!r} is more than {limits.max_repeat} (the [grammar] max_repeat setting)",
                            f"{where}.{key}")
    for key in ALTERNATIVES:
        value = node.get(key)
        if isinstance(value, list) and len(value) > limits.max_enum:
            raise ToolError(_too_many(len(value), key, limits), f"{where}.{key}")
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        _check_pattern(pattern, f"{where}.pattern", limits)
    keyed = node.get("patternProperties")
    for key in keyed if isinstance(keyed, dict) else ():
        _check_pattern(key, f"{where}.patternProperties.{key[:60]}", limits)


def _check_pattern(pattern: str, where: str, limits: GrammarConfig) -> None:
    """Each `{m}`, `{m,}` or `{m,n}` of a pattern is a repetition like maxLength's; and the pattern's
    grammar must be cheap to weigh by construction (`homeai.tools.patterns`: seconds a token otherwise)."""
    for match in QUANTIFIER.finditer(pattern):
        for number in match.groups():
            if number and (len(number) > 18 or int(number) > limits.max_repeat):
                raise ToolError(f"the repetition {match.group(0)[:40]} is more than {limits.max_repeat} "
                                "(the [grammar] max_repeat setting)", where)
    try:
        patterns.check(pattern, limits.max_repeat, limits.max_enum)
    except patterns.PatternError as e:
        raise ToolError(str(e), where) from None


def _too_many(count: int, key: str, limits: GrammarConfig) -> str:
    return f"{key} has {count} entries; at most {limits.max_enum} are taken (the [grammar] max_enum setting)"


class Widths:
    """How many alternatives a schema offers at one place, its `$ref`s followed: an `enum`'s values,
    the sum of an `anyOf`'s or `oneOf`'s branches, an object's optional properties (any may come
    first). Counting stops past `cap`; a reference to a schema being counted counts once."""

    def __init__(self, root: Any, cap: int):
        self.root, self.cap = root, cap
        self.known: dict[str, int] = {}

    def of(self, node: Any) -> int:
        if not isinstance(node, dict):
            return 1
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref)
        for key in ("enum", "anyOf", "oneOf"):
            options = node.get(key)
            if isinstance(options, list):
                return min(self.cap + 1, len(options) if key == "enum" else sum(self.of(o) for o in options))
        properties = node.get("properties")
        widest = max((self.of(p) for p in properties.values()), default=1) if isinstance(properties, dict) else 1
        items = node.get("items")
        return min(self.cap + 1, max(widest, self.of(items) if isinstance(items, dict) else 1,
                                     len(properties) if isinstance(properties, dict) else 1))

    def _ref(self, ref: str) -> int:
        if ref in self.known:
            return self.known[ref]
        self.known[ref] = 1  # a recursive reference counts once
        target = self._resolve(ref)
        self.known[ref] = self.of(target) if target is not None else 1
        return self.known[ref]

    def _resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node


def check_gbnf(text: str, where: str, limits: GrammarConfig) -> None:
    """Refuse GBNF larger than `max_grammar_bytes` or with groups nested deeper than llama.cpp's
    parser can safely recurse."""
    size = len(text.encode("utf-8"))
    if size > limits.max_grammar_bytes:
        raise ToolError(f"its grammar would be {size} bytes; at most {limits.max_grammar_bytes} are taken "
                        "(the [grammar] max_grammar_bytes setting): ask for fewer or shorter alternatives "
                        "and repetitions", where)
    depth = group_depth(text)
    if depth > MAX_GROUP_DEPTH:
        raise ToolError(f"its grammar would nest {depth} groups; at most {MAX_GROUP_DEPTH}: ask for fewer "
                        "repetitions", where)


def group_depth(text: str) -> int:
    """The deepest nesting of `(` groups in GBNF, outside string literals and character classes."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"[":
            i = _skip_quoted(text, i, '"' if c == '"' else "]")
            continue
        if c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest


def _skip_quoted(text: str, start: int, close: str) -> int:
    """The index after the literal or class that opens at `start` (a backslash escapes the next character)."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == close:
            return i + 1
        i += 1
    return i
