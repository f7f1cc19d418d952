"""What every call format shares: the calls found in a reply (`RawCall`, `Block`), where a call
opens in a stream, the lazy grammar's trigger, and the GBNF pieces the formats build from (a call
object `{"name", "arguments"}` for the JSON forms, each argument's value rule for the forms that
write arguments one by one).

The JSON schemas become GBNF by llama.cpp's converter, which the llama package owns (importing it
loads llama.cpp); the tools import neither. They name what they need of it (`SchemaConverter`) and
are handed one as a value: the service passes its runner's (`Runner.schema_converter`) to
`tools.plan` and to the structured-output grammars, and tests pass the real one
(`homeai.llama.CONVERTER`). A value rather than a converter registered at start-up: nothing to
forget to register, and each grammar's inputs are all in its call.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from typing import Iterator, NamedTuple, Protocol

from homeai.sched.request import Grammar
from homeai.tools.spec import Tool, ToolError, ToolSet

MAX_CALLS = 4  # calls in one reply, at most: a small model left free repeats a call until its tokens run out


class RawCall(NamedTuple):
    """A call as the model wrote it, not yet validated: its id when the model wrote one (Mistral)."""

    name: str
    arguments: object
    id: str | None = None


class Block(NamedTuple):
    """One call's markup in a reply, `text[start:end]`, and the calls written whole in it (a list
    form holds several); `whole`: nothing more is to come in it (False: cut short, or not well formed)."""

    start: int
    end: int
    calls: list[RawCall]
    whole: bool


class SchemaConverter(Protocol):
    """JSON schemas to GBNF text (`homeai.llama.grammar.Converter` is the one). Both raise a ValueError
    (its GrammarError) for a schema the converter cannot handle: the client's fault."""

    def grammar(self, schema: dict, rule: str) -> str:
        """GBNF rules for JSON that matches `schema`, its top rule named `rule`."""

    def grammars(self, parts: dict[str, tuple[str, dict, str | None]]) -> tuple[str, dict[str, str]]:
        """GBNF rules for several schemas in one grammar: `parts` maps a rule name to (the name the
        schema's `$ref`s resolve under, the schema, one of its properties or None for the whole).
        Returns the rules and, per name, the rule that matches it."""


def _call_schema(tools: tuple[Tool, ...], arguments_key: str) -> dict:
    variants = [{"type": "object", "properties": {"name": {"const": t.name}, arguments_key: t.parameters},
                 "required": ["name", arguments_key]} for t in tools]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def refused_schema(tools: ToolSet, error: ValueError, converter: SchemaConverter) -> ToolError:
    """The ToolError naming the tool whose schema the grammar converter cannot handle."""
    for i, tool in enumerate(tools.tools):
        try:
            converter.grammar(tool.parameters, "call")
        except ValueError as e:
            return ToolError(str(e), f"tools.{i}.function.parameters")
    return ToolError(str(error), "tools")


def call_rules(tools: ToolSet, converter: SchemaConverter, arguments_key: str = "arguments") -> str:
    """The rule `call`: one call object of an offered tool, its arguments to the tool's schema. A
    schema the converter cannot handle is the client's fault: the ToolError names the tool."""
    try:
        return converter.grammar(_call_schema(tools.offered(), arguments_key), "call")
    except ValueError as error:  # GrammarError: find which tool's schema it is
        raise refused_schema(tools, error, converter) from None


def arguments_rules(tools: ToolSet, converter: SchemaConverter) -> tuple[str, list[str]]:
    """GBNF rules for each offered tool's arguments object (rule `args-N` for the Nth), for the forms
    that write the name apart from the arguments (`NAME[ARGS]{...}`)."""
    parts = {f"args-{i}": (i, None) for i in range(len(tools.offered()))}
    text, names = schema_rules(tools, converter, parts)
    return text, [names[k] for k in parts]


def schema_rules(tools: ToolSet, converter: SchemaConverter,
                 parts: dict[str, tuple[int, str | None]]) -> tuple[str, dict[str, str]]:
    """GBNF rules for several schemas in one grammar: `parts` maps a rule name to (an offered tool's
    index, one of its arguments' properties, or None for the whole arguments object), `$ref`s
    resolving against the tool's schema. Returns the rules and, per name, the rule that matches it
    (a plain type's shared rule, `string` or `integer`, rather than the name)."""
    offered = tools.offered()
    try:
        return converter.grammars({name: (f"tool-{index}", offered[index].parameters, key)
                                   for name, (index, key) in parts.items()})
    except ValueError as error:  # GrammarError: find which tool's schema it is
        raise refused_schema(tools, error, converter) from None


def decode_at(text: str, start: int) -> tuple[object, int] | None:
    """The JSON value at `start` and where it ends (None: not one, or nested past Python's depth)."""
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return None


def skip_space(text: str, at: int, chars: str = " \t\n\r") -> int:
    while at < len(text) and text[at] in chars:
        at += 1
    return at


def name_and(call: object, key: str = "arguments", ids: bool = False) -> RawCall:
    """A call object `{"name": ..., key: {...}}`, its `id` kept with `ids` (Mistral's: others' models
    write none that a client could rely on)."""
    if not isinstance(call, dict):
        return RawCall("", None)
    ident = call.get("id") if ids and isinstance(call.get("id"), str) else None
    return RawCall(call.get("name") if isinstance(call.get("name"), str) else "", call.get(key, {}), ident)


def objects_from(text: str, at: int, key: str = "arguments", ids: bool = False) -> tuple[list[RawCall], int, bool]:
    """The call objects of a JSON list's items from `at` (just inside its `[`), separated by commas:
    the calls written whole, where they end, and whether the list is closed after them."""
    calls = []
    while True:
        at = skip_space(text, at, " \t\n\r,")
        if text[at:at + 1] == "]":
            return calls, at + 1, True
        decoded = decode_at(text, at) if text[at:at + 1] == "{" else None
        if decoded is None:
            return calls, at, False
        calls.append(name_and(decoded[0], key, ids))
        at = decoded[1]


def json_calls(text: str, at: int, key: str = "arguments") -> tuple[list[RawCall], int, bool]:
    """A JSON call object or a list of them at `at`: (calls written whole, end, whether all is written)."""
    at = skip_space(text, at)
    if text[at:at + 1] == "[":
        return objects_from(text, at + 1, key)
    decoded = decode_at(text, at) if text[at:at + 1] == "{" else None
    if decoded is None or not isinstance(decoded[0], dict):
        return [], at, False
    return [name_and(decoded[0], key)], decoded[1], True


def escape(text: str) -> str:
    """A literal in the trigger's regex (ECMAScript, llama.cpp's std::regex: escape only what is special)."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in text)


def chars(text: str) -> list[str]:
    return [escape(c) for c in text]


def prefixes(units: list[str]) -> str:
    """A regex matching any prefix of `units` (each a regex for one step), the empty one included."""
    out = ""
    for unit in reversed(units):
        out = f"(?:{unit}{out})?"
    return out


SP = " ?"  # the converter's `space ::= " "?`, as a regex unit


def names_unit(tools: ToolSet) -> str:
    """A regex unit: any prefix of an offered tool's name."""
    return "(?:" + "|".join(prefixes(chars(t.name)) for t in tools.offered()) + ")"


def call_units(tools: ToolSet, with_brace: bool = True) -> list[str]:
    """How every call object opens, `{"name": "` and a prefix of an offered tool's name, as regex units."""
    return [*(["\\{", SP] if with_brace else []), *chars('"name"'), SP, ":", SP, '"', names_unit(tools)]


def literal(text: str) -> str:
    """A GBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def repeated(block: str, tools: ToolSet, between: str = "") -> str:
    """`block` once, or up to MAX_CALLS times when parallel calls are allowed."""
    if not tools.parallel:
        return block
    return f"{block} ({between}{block}){{0,{MAX_CALLS - 1}}}"


class CallFormat:
    """How one family writes a call. A lazy grammar starts where the trigger pattern's group starts,
    and llama.cpp hands the grammar the text from there to the end of the output so far, which must
    be text the grammar accepts (llama.cpp aborts otherwise). So a trigger is the call's opener
    followed by only a prefix of what the grammar takes next; a token that runs past that in a way
    the grammar would refuse leaves the grammar off, and the reply is checked as text (the schemas).

    llama.cpp *searches* the output for a trigger pattern, so the pattern is anchored at both ends
    (`^...$`): unanchored, the opener's first character anywhere in a reply (`{` in "here is an
    example: {}") started the grammar mid-text on text it refuses, and llama.cpp aborted the
    whole process.

    A format finds its calls as `Block`s (`blocks`); a reply is its calls when every block is
    whole, and a stream sends each call the moment it is written whole."""

    name = ""
    openers: tuple[str, ...] = ()  # literals a call starts with, anywhere in a reply
    start_openers: tuple[str, ...] = ()  # literals a call starts with only at the reply's start
    tools_in_template = True  # the template renders `tools` and the calls in history itself
    stops: tuple[str, ...] = ()  # text that ends the reply after a call (llama-server's additional stops)

    def __init__(self, source: str | None = None):
        self.source = source  # the chat template this format was chosen from (None: not known)

    @property
    def opener(self) -> str:
        return (self.openers or self.start_openers)[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # ---- the grammar ----

    def grammar(self, tools: ToolSet, converter: SchemaConverter) -> Grammar:
        """The grammar holding a call to the tools' schemas (by `converter`), lazy unless a call is forced."""
        root = self._root(tools, converter)
        if tools.forced:
            return Grammar(root, param="tools")
        patterns = tuple(f"^{start}({mandatory}{prefixes(rest)})$" for start, mandatory, rest in self._triggers(tools))
        return Grammar(root, trigger_patterns=patterns, param="tools")

    def _triggers(self, tools: ToolSet) -> list[tuple[str, str, list[str]]]:
        """(what may come before, the regex a trigger must match, the units it may go on with), one per
        way a call opens."""
        raise NotImplementedError

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        """The GBNF, its rule `root` a call (or several, when parallel calls are allowed)."""
        raise NotImplementedError

    # ---- the conversation ----

    def messages(self, messages: list[dict], tools: ToolSet | None) -> list[dict]:
        """The conversation as this format's template takes it: as it is (no text as ""), for one
        that renders earlier calls; else each call written into its message's text as the model
        writes it (a template that only shows `content`, Granite 3's, would fail on a call's empty
        content)."""
        if self.source is None or "tool_calls" in self.source:
            # No text is "", as llama-server gives it: OpenAI clients send a call's `content: null`,
            # on which Qwen3's and gpt-oss's templates fail (`'<think>' in content`).
            return [m if m.get("content") is not None else {**m, "content": ""} for m in messages]
        return [self._with_calls_written(m) for m in messages]

    def _with_calls_written(self, message: dict) -> dict:
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            return {**message, "content": message.get("content") or ""}
        written = self.write([call_of(c) for c in message["tool_calls"]])
        rest = {k: v for k, v in message.items() if k != "tool_calls"}
        return {**rest, "content": "".join(p for p in (message.get("content"), written) if p)}

    def write(self, calls: list[dict]) -> str:
        """Calls (`call_of`'s dicts) as the model writes them."""
        raise NotImplementedError

    def new_id(self) -> str:
        """An id for a call the model wrote without one."""
        return f"call_{secrets.token_hex(12)}"

    def arguments_for(self, tool: Tool, arguments: object) -> object:
        """The arguments as the tool's schema types them (a form that writes values as text: XML)."""
        return arguments

    # ---- finding calls ----

    def blocks(self, text: str) -> Iterator[Block]:
        """The reply's calls, in order, from the first opener on."""
        raise NotImplementedError

    def find_calls(self, text: str) -> tuple[str, list[RawCall]] | None:
        """The text around the calls and the calls; None when the reply holds no well-formed call."""
        found = list(self.blocks(text))
        if not found or not all(b.whole and b.calls for b in found):
            return None
        content, at = [], 0
        for block in found:
            content.append(text[at:block.start])
            at = block.end
        content.append(text[at:])
        return "".join(content).strip(), [call for b in found for call in b.calls]

    def whole_calls(self, text: str) -> list[RawCall]:
        """The calls of a reply that opens a call, as far as they are written whole: a stream sends
        each as soon as it is (as Ollama does), rather than when the reply ends."""
        calls = []
        for block in self.blocks(text):
            calls += block.calls
            if not block.whole:
                break
        return calls

    def opens_at(self, text: str, since: int = 0) -> int | None:
        """Where in `text` (from `since`) a call opens, the whitespace after a `{` allowed (None: nowhere)."""
        return min((i for i, opener in self._starts(text, since)
                    if _squash(text[i:], opener).startswith(opener)), default=None)

    def may_open_at(self, text: str, since: int = 0) -> int | None:
        """Where a call may be opening at the end of `text` (its start, not yet all written)."""
        return min((i for i, opener in self._starts(text, since)
                    if opener.startswith(_squash(text[i:], opener))), default=None)

    def _starts(self, text: str, since: int) -> Iterator[tuple[int, str]]:
        """Where a call could open: at an opener's first character, or only at the reply's start."""
        for opener in self.openers:
            for m in re.finditer(re.escape(opener[0]), text[since:]):
                yield since + m.start(), opener
        start = len(text) - len(text.lstrip())
        if text.strip() and start >= since:
            for opener in self.start_openers:
                yield start, opener


def _squash(tail: str, opener: str) -> str:
    """JSON openers allow whitespace after their `{`: `{ "name"` opens as `{"name"` does."""
    return "{" + tail[1:].lstrip() if opener.startswith("{") else tail


def short_id(length: int = 9) -> str:
    """A call id of letters and digits, as Mistral's templates require (9 characters)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(length))


def stable_id(seed: str, length: int = 9) -> str:
    """A short id derived from `seed`: the same history renders the same prompt each turn."""
    digest = hashlib.sha256(seed.encode()).digest()
    alphabet = string.ascii_letters + string.digits
    return "".join(alphabet[b % len(alphabet)] for b in digest[:length])


def call_of(call: dict) -> dict:
    """An OpenAI or Ollama call from history: its id, name and arguments (a JSON string or an object)."""
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return {"id": call.get("id"), "name": function.get("name", ""), "arguments": arguments}
