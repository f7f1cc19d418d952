"""JSON schemas as GBNF text: llama-cpp-python's converter (`SchemaConverter`), its literals written as
JSON text holds them and its strings strict (no raw control character, quote or backslash).

The converter is pure Python, but importing it loads llama.cpp, hence here. The tools build their
grammars with it without importing this package: whoever holds the runner hands them
`CONVERTER` (`Runner.schema_converter`), which is what `homeai.tools.formats.base.SchemaConverter`
asks for.
"""

from __future__ import annotations

import copy
import json

from llama_cpp.llama_grammar import SchemaConverter


class GrammarError(ValueError):
    """A JSON schema llama-cpp-python's converter cannot turn into a grammar: the request's fault."""


def json_schema_grammar(schema: dict, rule: str = "root") -> str:
    """GBNF rules for JSON that matches `schema`, its top rule named `rule`, by llama-cpp-python's
    converter (pure Python, but importing it loads llama.cpp, hence here). Local `$ref`s resolve;
    remote ones are refused. Keywords the converter does not know are either refused (`not`) or
    ignored (`format`): the caller validates the output against the schema as well."""
    converter = _JsonConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        top = converter.visit(converter.resolve_refs(copy.deepcopy(schema), "request"),
                              "" if rule == "root" else rule)
    except Exception as e:  # the converter asserts on what it cannot handle (its message may hold the schema)
        raise GrammarError(f"this JSON schema cannot be turned into a grammar: {str(e)[:160]}") from None
    text = strict_strings(converter.format_grammar())
    return text if top == rule else f"{text}\n{rule} ::= {top}\n"


def json_schemas_grammar(parts: dict[str, tuple[str, dict, str | None]]) -> tuple[str, dict[str, str]]:
    """GBNF rules for several schemas in one grammar: `parts` maps a rule name to (the name the schema's
    `$ref`s resolve under, the schema, one of its properties or None for the whole). A schema named
    twice is resolved once, so its parts resolve against it whole. Returns the rules and, per name,
    the rule that matches it (a plain type's shared rule, `string` or `integer`, rather than the name)."""
    converter = _JsonConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    resolved: dict[str, dict] = {}
    names = {}
    try:
        for name, (source, schema, key) in parts.items():
            if source not in resolved:  # resolved in place, in a copy: its parts are then resolved too
                resolved[source] = converter.resolve_refs(copy.deepcopy(schema), source)
            whole = resolved[source]
            names[name] = converter.visit(whole if key is None else whole["properties"][key], name)
    except Exception as e:  # the converter asserts on what it cannot handle
        raise GrammarError(f"this JSON schema cannot be turned into a grammar: {str(e)[:160]}") from None
    return strict_strings(converter.format_grammar()), names


class Converter:
    """JSON schemas to GBNF text as the tools ask for it (`homeai.tools.formats.base.SchemaConverter`):
    both raise GrammarError (a ValueError) for a schema the converter cannot handle."""

    grammar = staticmethod(json_schema_grammar)
    grammars = staticmethod(json_schemas_grammar)


CONVERTER = Converter()


class _JsonConverter(SchemaConverter):
    """llama-cpp-python's converter, its literals written as JSON text holds them. Its own left a
    backslash as it was (a const `a"b` made a broken grammar, `a\\b` the wrong value, `a\\nb` a raw
    newline) and put a pattern's literal text raw inside the string (`^say "hi"$`: a raw quote)."""

    _in_pattern = False

    def _format_literal(self, literal: str) -> str:  # JSON text: a const, an enum value, a property name
        return _gbnf_literal(_readable_json(literal))

    def _visit_pattern(self, pattern, name):
        self._in_pattern = True
        try:
            return super()._visit_pattern(pattern, name)
        finally:
            self._in_pattern = False

    def _add_rule(self, name, rule):
        return super()._add_rule(name, _pattern_as_json(rule) if self._in_pattern else rule)


def _readable_json(text: str) -> str:
    """JSON text with its letters beyond ASCII as themselves (`ü`, not `\\u00fc`: what a model writes)."""
    try:
        readable = json.dumps(json.loads(text), ensure_ascii=False)
        readable.encode("utf-8")  # a lone surrogate stays escaped
        return readable
    except (ValueError, UnicodeEncodeError):
        return text


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


STRING_OPEN, STRING_CLOSE = '"\\"" ', ' "\\"" space'  # around the converter's rule for a pattern


def _pattern_as_json(rule: str) -> str:
    """A rule the converter wrote for a pattern (or a part of one) with each literal as JSON writes
    that text inside a string: `"` as `\\"`, `\\` as `\\\\`, a newline as `\\n`. A literal llama.cpp
    would not parse (`\\d`) is left for it to refuse."""
    if rule.startswith(STRING_OPEN) and rule.endswith(STRING_CLOSE) and len(rule) >= len(STRING_OPEN + STRING_CLOSE):
        return STRING_OPEN + _pattern_as_json(rule[len(STRING_OPEN):-len(STRING_CLOSE)]) + STRING_CLOSE
    out, i = [], 0
    while i < len(rule):
        end = _literal_end(rule, i, '"' if rule[i] == '"' else "]") if rule[i] in '"[' else i + 1
        text = _gbnf_text(rule[i + 1:end - 1]) if rule[i] == '"' else None
        out.append(rule[i:end] if text is None else _gbnf_literal(_readable_json(json.dumps(text))[1:-1]))
        i = end
    return "".join(out)


def _gbnf_text(body: str) -> str | None:
    """The text a GBNF literal's body stands for; None when llama.cpp would not parse it."""
    chars, i = [], 0
    try:
        while i < len(body):
            code, i = _gbnf_char(body, i)
            chars.append(chr(code))
    except (IndexError, KeyError, ValueError):
        return None
    return "".join(chars)


NOT_IN_JSON_STRINGS = '"\\\\\\x00-\\x1F\\x7F'  # GBNF: a quote, a backslash and the control characters


def strict_strings(gbnf: str) -> str:
    """The converter's GBNF with every negated character class (`char ::= [^"\\]`, a pattern's
    `.` and `[^...]`) also refusing raw control characters, quotes and backslashes, as JSON strings
    must (llama.cpp's own converter writes `[^"\\\x7F\x00-\x1F]`): else a reply could hold a raw
    newline or tab inside a string, which strict `json.loads` refuses. A pattern's own class
    (`[ -~]`) loses them too (`_json_class`)."""
    out, i, n = [], 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c == '"':  # a literal: kept as it is
            end = _literal_end(gbnf, i, '"')
            out.append(gbnf[i:end])
            i = end
        elif c == "[":
            end = _literal_end(gbnf, i, "]")
            negated = gbnf.startswith("[^", i)
            out.append(f"[^{NOT_IN_JSON_STRINGS}{gbnf[i + 2:end]}" if negated else _json_class(gbnf[i:end]))
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


NOT_IN_JSON = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F))
ESCAPED = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}  # llama.cpp's parse_char


def _json_class(cls: str) -> str:
    """A GBNF class `[...]` without what cannot stand raw in a JSON string (as it is, when it holds
    none of that or llama.cpp would not parse it anyway)."""
    ranges = _class_ranges(cls[1:-1])
    if ranges is None or not any(lo <= b and a <= hi for lo, hi in ranges for a, b in NOT_IN_JSON):
        return cls
    for a, b in NOT_IN_JSON:
        ranges = [part for lo, hi in ranges for part in ((lo, min(hi, a - 1)), (max(lo, b + 1), hi)) if part[0] <= part[1]]
    if not ranges:
        return "[^\\x00-\\U0010FFFF]"  # nothing: the pattern asked only for characters JSON escapes
    return "[" + "".join(_escape_code(lo) + ("" if lo == hi else "-" + _escape_code(hi)) for lo, hi in ranges) + "]"


def _class_ranges(body: str) -> list[tuple[int, int]] | None:
    """The code point ranges of a GBNF class's body; None when it does not parse."""
    ranges, i = [], 0
    try:
        while i < len(body):
            lo, i = _gbnf_char(body, i)
            hi = lo
            if i + 1 < len(body) and body[i] == "-":
                hi, i = _gbnf_char(body, i + 1)
            ranges.append((lo, hi))
    except (IndexError, KeyError, ValueError):
        return None
    return ranges


def _gbnf_char(body: str, i: int) -> tuple[int, int]:
    """The code point of the (perhaps escaped) character at `i` of a GBNF literal or class, and where
    the next begins, as llama.cpp's parse_char reads it."""
    if body[i] != "\\":
        return ord(body[i]), i + 1
    kind = body[i + 1]
    digits = {"x": 2, "u": 4, "U": 8}.get(kind)
    if digits:
        if len(body[i + 2:i + 2 + digits]) != digits:
            raise ValueError("short escape")
        return int(body[i + 2:i + 2 + digits], 16), i + 2 + digits
    return ESCAPED[kind], i + 2


def _escape_code(code: int) -> str:
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _literal_end(text: str, start: int, close: str) -> int:
    i = start + 1
    while i < len(text) and text[i] != close:
        i += 2 if text[i] == "\\" else 1
    return i + 1
