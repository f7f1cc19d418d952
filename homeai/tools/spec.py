"""What a client asks of tool calling, validated where it enters: the tools, `tool_choice` and
`parallel_tool_calls`, in OpenAI's shape (the Ollama API and the voice socket send the same).

Every refusal is a `ToolError` naming the field at fault (`tools.0.function.name`), which the
routes answer with a 400. Here only the tools' shape is read (cheap, whatever their number); their
count and size, then whether each `parameters` is a valid JSON schema (`check_schema`, the costly
part: 2,800 tools took seconds) and can become a grammar, are checked in that order when the grammar
is built (`ToolPlan.grammar`), so a huge list is refused before any schema is validated.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
NO_PARAMETERS = {"type": "object", "properties": {}}
CHOICES = ("auto", "none", "required")


class ToolError(ValueError):
    """A tool definition, tool choice or output schema the server cannot take: the client's fault, a 400."""

    def __init__(self, message: str, param: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema of the arguments object

    def as_openai(self) -> dict:
        """The tool as chat templates take it (Hugging Face's `tools`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def check_arguments(self, arguments: Any) -> str | None:
        """Why `arguments` do not fit this tool's schema (None when they do)."""
        if not isinstance(arguments, dict):
            return "the arguments are not a JSON object"
        return validate(arguments, self.parameters)


@dataclass(frozen=True)
class ToolSet:
    """The request's tools and how it lets the model use them."""

    tools: tuple[Tool, ...]
    choice: str  # auto | required | named (none never makes a ToolSet)
    named: str | None = None  # the one tool a named choice forces
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    def offered(self) -> tuple[Tool, ...]:
        """The tools the model may call: the named one only, under a named choice."""
        return tuple(t for t in self.tools if self.named is None or t.name == self.named)

    def find(self, name: str) -> Tool | None:
        return next((t for t in self.offered() if t.name == name), None)


def tool_set(tools: list | None, tool_choice: Any = None, parallel_tool_calls: bool = True) -> ToolSet | None:
    """The validated tool set, or None when the model is to answer in plain text (no tools, `[]`,
    or `tool_choice: "none"`). Raises ToolError."""
    if tools is not None and not isinstance(tools, list):
        raise ToolError("must be a list of tools", "tools")
    parsed = tuple(_tool(t, f"tools.{i}") for i, t in enumerate(tools or ()))
    names = [t.name for t in parsed]
    if len(set(names)) < len(names):
        seen: set[str] = set()
        duplicate = next(n for n in names if n in seen or seen.add(n))
        raise ToolError(f"two tools are named {duplicate!r}", "tools")
    choice, named = _choice(tool_choice, names)
    if not isinstance(parallel_tool_calls, bool):
        raise ToolError("must be true or false", "parallel_tool_calls")
    if choice == "none" or not parsed:
        return None
    return ToolSet(parsed, choice, named, parallel_tool_calls)


def _tool(raw: Any, where: str) -> Tool:
    if not isinstance(raw, dict):
        raise ToolError("a tool is an object {type: \"function\", function: {...}}", where)
    if raw.get("type", "function") != "function":
        raise ToolError(f"only function tools are supported, got {raw.get('type')!r}", f"{where}.type")
    function = raw.get("function")
    if not isinstance(function, dict):
        raise ToolError("a function tool needs a function object", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolError("a tool needs a name", f"{where}.function.name")
    if not NAME.match(name):
        raise ToolError(f"{name!r} is not a valid name (letters, digits, _ and -, at most 64)",
                        f"{where}.function.name")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise ToolError("must be a string", f"{where}.function.description")
    parameters = function.get("parameters")
    return Tool(name, description, _parameters(parameters, f"{where}.function.parameters"))


def _parameters(schema: Any, where: str) -> dict:
    if schema is None or schema == {}:
        return NO_PARAMETERS
    if not isinstance(schema, dict):
        raise ToolError("must be a JSON schema (an object)", where)
    if schema.get("type", "object") != "object":
        raise ToolError(f"a tool's arguments are an object, but the schema's type is {schema.get('type')!r}", where)
    return schema


def check_schema(schema: Any, where: str) -> None:
    """Refuse what is not a valid JSON schema (by its own `$schema` draft, else 2020-12)."""
    if not isinstance(schema, dict):
        raise ToolError("must be a JSON schema (an object)", where)
    if not isinstance(schema.get("$schema", ""), str):
        raise ToolError("$schema must be a string (a draft's URI)", where)
    try:
        _validator(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ToolError(f"not a valid JSON schema: {e.message}", where) from None
    except RecursionError:
        raise ToolError("the schema is nested too deeply", where) from None
    except OverflowError:  # Python's re, checking a `pattern`: a repetition count over 4,294,967,295
        raise ToolError("not a valid JSON schema: a pattern's repetition count is too large", where) from None


def _validator(schema: dict):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def validate(instance: Any, schema: dict) -> str | None:
    """Why `instance` does not fit `schema` (None when it does)."""
    try:
        error = jsonschema.exceptions.best_match(_validator(schema).iter_errors(instance))
    except Exception as e:  # a reference it cannot resolve, say: the instance is not shown to fit
        return f"the schema could not be checked: {e}"
    return None if error is None else error.message


def _choice(raw: Any, names: list[str]) -> tuple[str, str | None]:
    if raw is None:
        return "auto", None
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise ToolError(f"must be one of {', '.join(CHOICES)} or a named function, got {raw!r}", "tool_choice")
        if raw == "required" and not names:
            raise ToolError("\"required\" needs tools", "tool_choice")
        return raw, None
    function = raw.get("function") if isinstance(raw, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or raw.get("type", "function") != "function":
        raise ToolError('a named choice is {"type": "function", "function": {"name": ...}}', "tool_choice")
    if name not in names:
        raise ToolError(f"names {name!r}, which is not among the tools ({', '.join(names) or 'none'})",
                        "tool_choice")
    return "named", name


def dumps(value: Any) -> str:
    """JSON as the calls are sent and shown to the model: compact, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
