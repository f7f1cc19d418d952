"""The families that write a call's arguments one by one rather than as a JSON object.

* Qwen3-Coder (and Qwen3.5's XML form): `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>`. Values are text; each is typed by the tool's schema (a string stays
  text; a number, boolean, object or array is read as JSON).
* Gemma: FunctionGemma's `<start_function_call>call:NAME{key:<escape>text<escape>,n:12}<end_function_call>`
  and Gemma 4's `<|tool_call>call:NAME{key:<|"|>text<|"|>}<tool_call|>`, as llama.cpp's common/chat.cpp
  reads them: a string between quote markers, any other value raw (JSON, or bare keys inside).
  Its grammar holds a nested object or array to JSON, as llama.cpp's does; both are read.

Their grammars hold each argument to its schema, in the schema's order (required ones first, as
llama.cpp's do); a text value is held to have no `<` (the next marker), as llama.cpp's are.
"""

from __future__ import annotations

import json
import re
from typing import Callable, Iterator

from homeai.tools.formats.base import Block, CallFormat, RawCall, SchemaConverter, chars, decode_at, escape, literal, \
    names_unit, repeated, schema_rules, skip_space
from homeai.tools.spec import Tool, ToolSet

_NAME = re.compile(r"[A-Za-z0-9_\-.]+")


def _strings(schema: dict) -> list[str] | None:
    """The strings an enum or const allows (None: not only strings)."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return values if values and all(isinstance(v, str) for v in values) else None


def is_text(schema: object) -> bool:
    """A value the model writes as plain text: a string, by type or by its enum's values."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    return kind == "string" or (isinstance(kind, list) and "string" in kind) or _strings(schema) is not None


def _sequence(required: list[str], optional: list[str], sep: str) -> str:
    """GBNF for the required items in order, then any of the optional ones in order, `sep` between."""
    if required:
        return " ".join([f" {sep} ".join(required), *(f"({sep} {o})?" for o in optional)])
    if not optional:
        return ""
    alternatives = [" ".join([optional[i], *(f"({sep} {o})?" for o in optional[i + 1:])]) for i in range(len(optional))]
    return "(" + " | ".join(alternatives) + ")?"


def argument_bodies(tools: ToolSet, converter: SchemaConverter, item: Callable[[str, str], str],
                    text_rule: Callable[[dict], str | None], sep: str) -> tuple[str, list[str]]:
    """Per offered tool, GBNF for its arguments written one by one: `item(key, value_rule)` each,
    `text_rule(schema)` for a value written as text (None: a JSON value, the converter's rule)."""
    offered = tools.offered()
    properties = [list((t.parameters.get("properties") or {}).items()) for t in offered]
    parts = {f"t{i}-p{j}": (i, key) for i, props in enumerate(properties)
             for j, (key, schema) in enumerate(props) if text_rule(schema) is None}
    text, names = schema_rules(tools, converter, parts) if parts else ("", {})
    bodies = []
    for i, (tool, props) in enumerate(zip(offered, properties)):
        required = set(tool.parameters.get("required") or ())
        items = [(key in required, item(key, text_rule(schema) or names[f"t{i}-p{j}"]))
                 for j, (key, schema) in enumerate(props)]
        bodies.append(_sequence([x for r, x in items if r], [x for r, x in items if not r], sep))
    return text, bodies


class QwenXML(CallFormat):
    name = "qwen-xml"
    openers = ("<tool_call>", "<function=")  # Qwen3-Coder now and then leaves out the <tool_call>

    def _triggers(self, tools: ToolSet):
        return [("[\\s\\S]*?", escape("<tool_call>"), ["\\n?", *chars("<function="), names_unit(tools)])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        def text_rule(schema):
            strings = _strings(schema) if isinstance(schema, dict) else None
            return "(" + " | ".join(literal(s) for s in strings) + ")" if strings else \
                ("xml-text" if is_text(schema) else None)

        def item(key, rule):
            return f'{literal(f"<parameter={key}>")} "\\n"? {rule} "\\n"? "</parameter>" "\\n"?'

        text, bodies = argument_bodies(tools, converter, item, text_rule, "")
        functions = " | ".join(f'"<function={t.name}>" "\\n"? {body} "</function>"'
                               for t, body in zip(tools.offered(), bodies))
        block = f'("<tool_call>" "\\n"? ({functions}) "\\n"? "</tool_call>")'
        root = repeated(block, tools, '"\\n"? ')
        return f"{text}\nxml-text ::= [^<]*\nroot ::= {root}\n"

    def blocks(self, text: str) -> Iterator[Block]:
        at = 0
        while (start := self.opens_at(text, at)) is not None:
            body = start + len("<tool_call>") if text.startswith("<tool_call>", start) else start
            call, end = _xml_function(text, skip_space(text, body))
            if call is None:
                yield Block(start, len(text), [], False)
                return
            after = skip_space(text, end)
            end = after + len("</tool_call>") if text.startswith("</tool_call>", after) else end
            yield Block(start, end, [call], True)
            at = end

    def arguments_for(self, tool: Tool, arguments: object) -> object:
        if not isinstance(arguments, dict):
            return arguments
        properties = tool.parameters.get("properties") or {}
        return {key: value if is_text(properties.get(key)) else _json_or_text(value)
                for key, value in arguments.items()}

    def write(self, calls: list[dict]) -> str:
        def value(v):
            return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

        return "\n".join("<tool_call>\n<function=" + c["name"] + ">\n" + "".join(
            f"<parameter={k}>\n{value(v)}\n</parameter>\n" for k, v in (c["arguments"] or {}).items())
            + "</function>\n</tool_call>" for c in calls)


_FUNCTION = re.compile(r"<function=([^>\s]+)>")
_PARAMETER = re.compile(r"<parameter=([^>]+)>")


def _xml_function(text: str, at: int) -> tuple[RawCall | None, int]:
    """`<function=NAME>` and its parameters up to `</function>` (None: not written whole)."""
    opened = _FUNCTION.match(text, at)
    if opened is None:
        return None, at
    arguments, at = {}, opened.end()
    while True:
        at = skip_space(text, at)
        if text.startswith("</function>", at):
            return RawCall(opened.group(1), arguments), at + len("</function>")
        parameter = _PARAMETER.match(text, at)
        close = text.find("</parameter>", parameter.end()) if parameter else -1
        if close < 0:
            return None, at
        value = text[parameter.end():close]
        arguments[parameter.group(1).strip()] = value.removeprefix("\n").removesuffix("\n")
        at = close + len("</parameter>")


def _json_or_text(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


class Gemma(CallFormat):
    """FunctionGemma's form (Gemma 3 270M tuned for function calls)."""

    name = "gemma"
    openers = ("<start_function_call>",)
    close = "<end_function_call>"
    quote = "<escape>"
    stops = ("<end_function_call>",)  # llama-server's additional stop: the tool's answer comes next

    def _triggers(self, tools: ToolSet):
        return [("[\\s\\S]*?", escape(self.opener), [*chars("call:"), names_unit(tools)])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        quote = literal(self.quote)

        def text_rule(schema):
            strings = _strings(schema) if isinstance(schema, dict) else None
            inner = "(" + " | ".join(literal(s) for s in strings) + ")" if strings else "gemma-text"
            return f"{quote} {inner} {quote}" if is_text(schema) else None

        text, bodies = argument_bodies(tools, converter, lambda key, rule: f"{literal(key + ':')} {rule}", text_rule,
                                       '","')
        functions = " | ".join(f'"call:{t.name}{{" {body} "}}"' for t, body in zip(tools.offered(), bodies))
        block = f"({literal(self.opener)} ({functions}) {literal(self.close)})"
        return f"{text}\ngemma-text ::= [^<]*\nroot ::= {repeated(block, tools)}\n"

    def blocks(self, text: str) -> Iterator[Block]:
        at = 0
        while (start := text.find(self.opener, at)) >= 0:
            at = start + len(self.opener)
            name = _NAME.match(text, at + 5) if text.startswith("call:", at) else None
            parsed = _arguments(text, name.end(), self.quote) if name and text.startswith("{", name.end()) else None
            if parsed is None:
                yield Block(start, len(text), [], False)
                return
            arguments, end = parsed
            after = skip_space(text, end)
            end = after + len(self.close) if text.startswith(self.close, after) else end
            yield Block(start, end, [RawCall(name.group(0), arguments)], True)
            at = end

    def write(self, calls: list[dict]) -> str:
        return "".join(f"{self.opener}call:{c['name']}{_gemma_text(c['arguments'], self.quote)}{self.close}"
                       for c in calls)


class Gemma4(Gemma):
    name = "gemma4"
    openers = ("<|tool_call>",)
    close = "<tool_call|>"
    quote = '<|"|>'
    stops = ()


def _arguments(text: str, at: int, quote: str) -> tuple[object, int] | None:
    try:
        return _value(text, at, quote)
    except RecursionError:  # nested past Python's depth: not a call
        return None


def _value(text: str, at: int, quote: str) -> tuple[object, int] | None:
    """A Gemma value at `at` and where it ends (None: not written whole, or not well formed)."""
    at = skip_space(text, at)
    if text.startswith(quote, at):
        close = text.find(quote, at + len(quote))
        return (text[at + len(quote):close], close + len(quote)) if close >= 0 else None
    if text.startswith("{", at) or text.startswith("[", at):
        return _collection(text, at, quote)
    if text.startswith('"', at):
        return decode_at(text, at)
    token = re.compile(r"[^,}\]]*").match(text, at)
    end = token.end()
    if end >= len(text) or not token.group(0).strip():
        return None  # a raw value runs to a `,`, `}` or `]` that has not come yet
    return _json_or_text(token.group(0).strip()), end


def _collection(text: str, at: int, quote: str) -> tuple[object, int] | None:
    """`{key:value,...}` (keys bare, quoted or JSON strings) or `[value,...]`."""
    closing, out = ("}", {}) if text[at] == "{" else ("]", [])
    at += 1
    while True:
        at = skip_space(text, at)
        if text.startswith(closing, at):
            return out, at + 1
        if isinstance(out, dict):
            key = _key(text, at, quote)
            if key is None:
                return None
            name, at = key
            at = skip_space(text, at)
            if not text.startswith(":", at):
                return None
            at += 1
        parsed = _value(text, at, quote)
        if parsed is None:
            return None
        if isinstance(out, dict):
            out[name] = parsed[0]
        else:
            out.append(parsed[0])
        at = skip_space(text, parsed[1])
        if text.startswith(",", at):
            at += 1
        elif not text.startswith(closing, at):
            return None


def _key(text: str, at: int, quote: str) -> tuple[str, int] | None:
    if text.startswith(quote, at) or text.startswith('"', at):
        parsed = _value(text, at, quote)
        return (parsed[0], parsed[1]) if parsed and isinstance(parsed[0], str) else None
    name = _NAME.match(text, at)
    return (name.group(0), name.end()) if name else None


def _gemma_text(arguments: dict, quote: str) -> str:
    """Arguments as the grammar holds them: a string between quote markers, any other value as JSON."""
    def value(v):
        return f"{quote}{v}{quote}" if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    return "{" + ",".join(f"{k}:{value(v)}" for k, v in (arguments or {}).items()) + "}"
