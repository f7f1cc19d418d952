"""How a model writes a tool call, one class per family, chosen from its chat template.

* Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call.
* Llama 3.x: the whole reply is `{"name": ..., "parameters": {...}}`.
* Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
* Generic, for templates that know no tools (the embedded SmolLM2): homeai describes the tools in
  the system prompt and the reply is either plain text or `{"tool_calls": [{"name", "arguments"}]}`.

Each format gives the grammar that holds a call to the tools' schemas (lazy, triggered at the
call's opening, when the model may also answer in text; from the first token when a call is
forced), finds the calls in a finished reply, and names the literal a call opens with, so a
stream can hold back text that may be one.
"""

from __future__ import annotations

import json
import re

from homeai.sched.request import Grammar
from homeai.tools.spec import Tool, ToolError, ToolSet, dumps

RawCall = tuple[str, object]  # (name, arguments) as the model wrote them, not yet validated
MAX_CALLS = 4  # calls in one reply, at most: a small model left free repeats a call until its tokens run out


def gbnf(schema: dict, rule: str) -> str:
    """GBNF rules for `schema` (the runner owns llama_cpp and its converter; imported here, when a
    grammar is first built, so that importing homeai.tools loads no shared library)."""
    from homeai.engine.runner import json_schema_grammar

    return json_schema_grammar(schema, rule)


def _call_schema(tools: tuple[Tool, ...], arguments_key: str) -> dict:
    variants = [{"type": "object", "properties": {"name": {"const": t.name}, arguments_key: t.parameters},
                 "required": ["name", arguments_key]} for t in tools]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def _call_rules(tools: ToolSet, arguments_key: str = "arguments") -> str:
    """The rule `call`: one call of an offered tool, its arguments to the tool's schema. A schema the
    converter cannot handle is the client's fault: the ToolError names the tool."""
    try:
        return gbnf(_call_schema(tools.offered(), arguments_key), "call")
    except ValueError as error:  # GrammarError: find which tool's schema it is
        for i, tool in enumerate(tools.tools):
            try:
                gbnf(tool.parameters, "call")
            except ValueError as e:
                raise ToolError(str(e), f"tools.{i}.function.parameters") from None
        raise ToolError(str(error), "tools") from None


def _decode_at(text: str, start: int) -> tuple[object, int] | None:
    try:
        return json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None


SP = " ?"  # the converter's `space ::= " "?`, as a regex unit


def _objects_from(text: str, at: int, key: str) -> list[RawCall]:
    """The call objects written whole from `at` on, separated by commas and whitespace."""
    calls = []
    while True:
        while at < len(text) and text[at] in " \t\n\r,":
            at += 1
        decoded = _decode_at(text, at) if text[at:at + 1] == "{" else None
        if decoded is None:
            return calls
        calls.append(_name_and(decoded[0], key))
        at = decoded[1]


def _escape(text: str) -> str:
    """A literal in the trigger's regex (ECMAScript, llama.cpp's std::regex: escape only what is special)."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in text)


def _chars(text: str) -> list[str]:
    return [_escape(c) for c in text]


def _prefixes(units: list[str]) -> str:
    """A regex matching any prefix of `units` (each a regex for one step), the empty one included."""
    out = ""
    for unit in reversed(units):
        out = f"(?:{unit}{out})?"
    return out


def _call_units(tools: ToolSet, with_brace: bool = True) -> list[str]:
    """How every call opens, `{"name": "` and a prefix of an offered tool's name, as regex units."""
    names = "|".join(_prefixes(_chars(t.name)) for t in tools.offered())
    return [*(["\\{", SP] if with_brace else []), *_chars('"name"'), SP, ":", SP, '"', f"(?:{names})"]


class CallFormat:
    """A lazy grammar starts where the trigger pattern's group starts, and llama.cpp hands the grammar
    the text from there to the end of the output so far, which must be text the grammar accepts
    (llama.cpp aborts otherwise). So a trigger is the call's opener followed by only a prefix of
    what the grammar takes next; a token that runs past that in a way the grammar would refuse
    leaves the grammar off, and the reply is checked as text (`find_calls` and the schemas).

    llama.cpp *searches* the output for a trigger pattern, so the pattern is anchored at both ends
    (`^...$`): unanchored, the opener's first character anywhere in a reply (`{` in "here is an
    example: {}") started the grammar mid-text on text it refuses, and llama.cpp aborted the
    whole process."""

    name = ""
    opener = ""  # the literal a call starts with
    anywhere = True  # a call may follow some text (False: only at the reply's start)
    tools_in_template = True  # the template renders `tools` and the calls in history itself

    def grammar(self, tools: ToolSet) -> Grammar:
        root = self._root(tools)
        if tools.forced:
            return Grammar(root, param="tools")
        start = "[\\s\\S]*?" if self.anywhere else "[ \\t\\n]*"
        mandatory, rest = self._trigger_units(tools)
        return Grammar(root, trigger_patterns=(f"^{start}({mandatory}{_prefixes(rest)})$",), param="tools")

    def _trigger_units(self, tools: ToolSet) -> tuple[str, list[str]]:
        """The regex a trigger must match and the units it may go on with."""
        raise NotImplementedError

    def _root(self, tools: ToolSet) -> str:
        raise NotImplementedError

    def messages(self, messages: list[dict], tools: ToolSet) -> list[dict]:
        """The conversation as this format's template takes it: as it is, for one that renders tools."""
        return messages

    def find_calls(self, text: str) -> tuple[str, list[RawCall]] | None:
        """The text around the calls and the calls; None when the reply holds no well-formed call."""
        raise NotImplementedError

    def whole_calls(self, text: str) -> list[RawCall]:
        """The calls of a reply that opens a call, as far as they are written whole: a stream sends
        each as soon as it is (as Ollama does), rather than when the reply ends."""
        raise NotImplementedError

    def opens_at(self, text: str) -> int | None:
        """Where in `text` a call opens, the whitespace after a `{` allowed (None: nowhere)."""
        return next((i for i in self._starts(text) if _squash(text[i:], self.opener).startswith(self.opener)), None)

    def may_open_at(self, text: str) -> int | None:
        """Where a call may be opening at the end of `text` (its start, not yet all written)."""
        return next((i for i in self._starts(text) if self.opener.startswith(_squash(text[i:], self.opener))), None)

    def _starts(self, text: str) -> list[int]:
        """Where a call could open: at the opener's first character, or only at the reply's start."""
        if self.anywhere:
            return [m.start() for m in re.finditer(re.escape(self.opener[0]), text)]
        return [len(text) - len(text.lstrip())] if text.strip() else []


def _squash(tail: str, opener: str) -> str:
    """JSON openers allow whitespace after their `{`: `{ "name"` opens as `{"name"` does."""
    return "{" + tail[1:].lstrip() if opener.startswith("{") else tail


_GENERIC_LIST = re.compile(r'\{\s*"tool_calls"\s*:\s*\[')


class Generic(CallFormat):
    name = "generic"
    opener = '{"tool_calls"'
    anywhere = False  # a reply that opens with `{` is a call: its grammar starts there
    tools_in_template = False

    def _trigger_units(self, tools: ToolSet) -> tuple[str, list[str]]:
        return "\\{", [SP, *_chars('"tool_calls"'), SP, ":", SP, "\\[", SP, *_call_units(tools)]

    def _root(self, tools: ToolSet) -> str:
        calls = f'call ("," space call){{0,{MAX_CALLS - 1}}}' if tools.parallel else "call"
        opening = '"{" space "\\"tool_calls\\"" space ":" space "[" space'
        return f'{_call_rules(tools)}\nroot ::= {opening} {calls} "]" space "}}" space\n'

    def find_calls(self, text: str) -> tuple[str, list[RawCall]] | None:
        at = self.opens_at(text)
        decoded = _decode_at(text, at) if at is not None else None
        if decoded is None or not isinstance(decoded[0], dict) or not isinstance(decoded[0].get("tool_calls"), list):
            return None
        calls = [_name_and(c, "arguments") for c in decoded[0]["tool_calls"]]
        return (text[:at] + text[decoded[1]:]).strip(), calls

    def whole_calls(self, text: str) -> list[RawCall]:
        at = self.opens_at(text)
        bracket = _GENERIC_LIST.match(text, at) if at is not None else None
        return _objects_from(text, bracket.end(), "arguments") if bracket else []

    def messages(self, messages: list[dict], tools: ToolSet) -> list[dict]:
        return generic_messages(messages, self.system_prompt(tools))

    def system_prompt(self, tools: ToolSet) -> str:
        """The tools, and how to call them, for a model whose template knows no tools. Small models
        follow an example better than a description, so the call is shown with the first tool."""
        described = "\n".join(dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                              for t in tools.offered())
        example = dumps({"tool_calls": [{"name": tools.offered()[0].name, "arguments": {}}]})
        when = "Call a tool now." if tools.forced else \
            "When a tool can do what the user asks, call it; otherwise answer in plain text."
        return (f"You have these tools:\n{described}\n\n{when} To call a tool, reply with only JSON and "
                f"nothing before it, like:\n{example}")


class Hermes(CallFormat):
    name = "hermes"
    opener = "<tool_call>"

    def _trigger_units(self, tools: ToolSet) -> tuple[str, list[str]]:
        return _escape(self.opener), ["\\n?", *_call_units(tools)]

    def _root(self, tools: ToolSet) -> str:
        block = '"<tool_call>" "\\n"? call "\\n"? "</tool_call>"'
        more = f' ("\\n"? {block}){{0,{MAX_CALLS - 1}}}' if tools.parallel else ""
        return f"{_call_rules(tools)}\nroot ::= {block}{more}\n"

    def find_calls(self, text: str) -> tuple[str, list[RawCall]] | None:
        blocks = list(re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.DOTALL))
        calls = []
        for block in blocks:
            decoded = _decode_at(block.group(1), 0)
            if decoded is None or not isinstance(decoded[0], dict):
                return None
            calls.append(_name_and(decoded[0], "arguments"))
        if not calls:
            return None
        return re.sub(r"<tool_call>.*?(?:</tool_call>|$)", "", text, flags=re.DOTALL).strip(), calls

    def whole_calls(self, text: str) -> list[RawCall]:
        calls = []
        for opening in re.finditer(re.escape(self.opener), text):
            found = _objects_from(text, opening.end(), "arguments")[:1]
            if not found:
                break
            calls += found
        return calls


class Llama3(CallFormat):
    name = "llama3"
    opener = '{"name"'
    anywhere = False

    def _trigger_units(self, tools: ToolSet) -> tuple[str, list[str]]:
        return "\\{", _call_units(tools)[1:]

    def _root(self, tools: ToolSet) -> str:
        return f"{_call_rules(tools, 'parameters')}\nroot ::= call\n"

    def find_calls(self, text: str) -> tuple[str, list[RawCall]] | None:
        body = text.strip().removeprefix("<|python_tag|>")
        decoded = _decode_at(body, 0) if body.startswith("{") else None
        if decoded is None or not isinstance(decoded[0], dict) or "name" not in decoded[0]:
            return None
        key = "parameters" if "parameters" in decoded[0] else "arguments"
        return body[decoded[1]:].strip(), [_name_and(decoded[0], key)]

    def whole_calls(self, text: str) -> list[RawCall]:
        found = self.find_calls(text)
        return found[1] if found else []


class Mistral(CallFormat):
    name = "mistral"
    opener = "[TOOL_CALLS]"

    def _trigger_units(self, tools: ToolSet) -> tuple[str, list[str]]:
        return _escape(self.opener), [SP, "\\[", SP, *_call_units(tools)]

    def _root(self, tools: ToolSet) -> str:
        calls = f'call ("," space call){{0,{MAX_CALLS - 1}}}' if tools.parallel else "call"
        return f'{_call_rules(tools)}\nroot ::= "[TOOL_CALLS]" space "[" space {calls} "]" space\n'

    def find_calls(self, text: str) -> tuple[str, list[RawCall]] | None:
        at = text.find(self.opener)
        if at < 0:
            return None
        rest = text[at + len(self.opener):]
        decoded = _decode_at(rest, len(rest) - len(rest.lstrip()))
        if decoded is None:
            return None
        items = decoded[0] if isinstance(decoded[0], list) else [decoded[0]]
        if not all(isinstance(c, dict) for c in items):
            return None
        return (text[:at] + rest[decoded[1]:]).strip(), [_name_and(c, "arguments") for c in items]

    def whole_calls(self, text: str) -> list[RawCall]:
        at = text.find(self.opener)
        bracket = re.compile(r"\s*\[").match(text, at + len(self.opener)) if at >= 0 else None
        return _objects_from(text, bracket.end(), "arguments") if bracket else []


def _name_and(call: object, key: str) -> RawCall:
    if not isinstance(call, dict):
        return ("", None)
    return (call.get("name") if isinstance(call.get("name"), str) else "", call.get(key, {}))


def for_template(source: str | None) -> CallFormat:
    """The call format a chat template writes (generic when it renders no tools)."""
    if not source or "tools" not in source:
        return Generic()
    if "<tool_call>" in source:
        return Hermes()
    if "[TOOL_CALLS]" in source:
        return Mistral()
    if "<|start_header_id|>" in source:
        return Llama3()
    return Generic()


def generic_messages(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """Messages for a template that knows no tools: calls as the JSON the model writes, results as
    user turns (consecutive ones merged, for templates that insist user and assistant alternate),
    and the tools' `system_prompt`, if any, after the client's own system prompt."""
    out: list[dict] = []
    names = {}  # call id -> tool name, for results that say only the id
    for message in messages:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = [_call_of(c) for c in message["tool_calls"]]
            names.update({c.get("id"): c["name"] for c in calls if c.get("id")})
            text = dumps({"tool_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in calls]})
            out.append({"role": "assistant", "content": "\n".join(p for p in (message.get("content"), text) if p)})
        elif role == "tool":
            name = message.get("name") or names.get(message.get("tool_call_id")) or "the tool"
            result = f"Result of {name}: {message.get('content') or ''}"
            if out and out[-1]["role"] == "user" and out[-1].get("tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        else:
            out.append({"role": role, "content": message.get("content") or ""})
    out = [{k: v for k, v in m.items() if k != "tool_results"} for m in out]
    if not system_prompt:
        return out
    if out and out[0]["role"] == "system":
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{system_prompt}"}, *out[1:]]
    return [{"role": "system", "content": system_prompt}, *out]


def _call_of(call: dict) -> dict:
    """An OpenAI or Ollama call from history: its id, name and arguments (a JSON string or an object)."""
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return {"id": call.get("id"), "name": function.get("name", ""), "arguments": arguments}
