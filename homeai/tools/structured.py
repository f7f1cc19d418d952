"""Structured output: a reply held to JSON, or to a JSON schema, by a grammar.

OpenAI's `response_format` (`text`, `json_object`, `json_schema` {name, schema, strict}) and
Ollama's `format` (`"json"` or a schema) become the same `Grammar`. A schema that is not a valid
JSON schema, that asks more of a grammar than the `[grammar]` limits allow (`homeai.tools.bounds`),
or that the converter cannot turn into a grammar, is refused (ToolError, a 400) before anything
is queued. The schema becomes GBNF by the converter the caller hands in (`SchemaConverter`: the
runner's; see `homeai.tools.formats.base`).
"""

from __future__ import annotations

from typing import Any

from homeai.config import GrammarConfig
from homeai.sched.request import Grammar
from homeai.tools import bounds
from homeai.tools.formats import SchemaConverter
from homeai.tools.spec import ToolError, check_schema

ANY_OBJECT = {"type": "object"}
DEFAULT_LIMITS = GrammarConfig()


def schema_grammar(schema: dict, param: str, limits: GrammarConfig = DEFAULT_LIMITS, *,
                   converter: SchemaConverter) -> Grammar:
    bounds.check_size(schema, param, limits)
    check_schema(schema, param)
    bounds.check_schema(schema, param, limits)
    try:
        text = converter.grammar(schema, "root")
    except ValueError as e:  # GrammarError: valid, but beyond the converter
        raise ToolError(str(e), param) from None
    bounds.check_gbnf(text, param, limits)
    return Grammar(text, param=param)


def response_format_grammar(response_format: Any, limits: GrammarConfig = DEFAULT_LIMITS, *,
                            converter: SchemaConverter) -> Grammar | None:
    """The grammar for OpenAI's `response_format` (None: free text)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ToolError("must be an object with a type", "response_format")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return schema_grammar(ANY_OBJECT, "response_format", limits, converter=converter)
    if kind != "json_schema":
        raise ToolError(f"type must be text, json_object or json_schema, got {kind!r}", "response_format.type")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ToolError("json_schema needs {name, schema}", "response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError("needs a name", "response_format.json_schema.name")
    if "strict" in spec and not isinstance(spec["strict"], (bool, type(None))):
        raise ToolError("must be true or false", "response_format.json_schema.strict")
    schema = spec.get("schema")
    return schema_grammar(ANY_OBJECT if schema in (None, {}) else schema, "response_format.json_schema.schema", limits,
                          converter=converter)


def ollama_format_grammar(format: Any, limits: GrammarConfig = DEFAULT_LIMITS, *,
                          converter: SchemaConverter) -> Grammar | None:
    """The grammar for Ollama's `format`: "json" or a JSON schema (None: free text)."""
    if format in (None, ""):
        return None
    if format == "json":
        return schema_grammar(ANY_OBJECT, "format", limits, converter=converter)
    if isinstance(format, dict):
        return schema_grammar(format, "format", limits, converter=converter)
    raise ToolError('must be "json" or a JSON schema', "format")
