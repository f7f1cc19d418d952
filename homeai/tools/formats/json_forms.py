"""The families that write a call as JSON behind a marker of their own.

* Hermes (Qwen2.5, Qwen3, Granite 4, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  one block per call.
* Llama 3.x: the whole reply is `{"name": ..., "parameters": {...}}`, or JSON after `<|python_tag|>`
  (several calls separated by `;`, Llama 3.2).
* Granite 3.x: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`.
* Phi-4-mini: `<|tool_call|>{...}<|/tool_call|>` per call (as llama.cpp's template asks), or the
  `functools[{...}, ...]` it was trained on.
"""

from __future__ import annotations

import json
from typing import Iterator

from homeai.tools.formats.base import SP, Block, CallFormat, SchemaConverter, call_rules, call_units, decode_at, \
    escape, json_calls, name_and, objects_from, repeated, skip_space
from homeai.tools.spec import ToolSet, dumps

ANYWHERE = "[\\s\\S]*?"
AT_START = "[ \\t\\n]*"


def _marked_blocks(text: str, opener: str, closer: str, at: int = 0) -> Iterator[Block]:
    """`opener` + a JSON call object or list + an optional `closer`, each time `opener` comes."""
    while (start := text.find(opener, at)) >= 0:
        calls, end, whole = json_calls(text, start + len(opener))
        if not whole:
            yield Block(start, len(text), calls, False)
            return
        after = skip_space(text, end)
        end = after + len(closer) if closer and text.startswith(closer, after) else end
        yield Block(start, end, calls, True)
        at = end


class Hermes(CallFormat):
    name = "hermes"
    openers = ("<tool_call>",)

    def _triggers(self, tools: ToolSet):
        return [(ANYWHERE, escape("<tool_call>"), ["\\n?", *call_units(tools)])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        block = '"<tool_call>" "\\n"? call "\\n"? "</tool_call>"'
        calls = repeated(f"({block})", tools, '"\\n"? ')
        return f"{call_rules(tools, converter)}\nroot ::= {calls}\n"

    def blocks(self, text: str) -> Iterator[Block]:
        return _marked_blocks(text, "<tool_call>", "</tool_call>")

    def write(self, calls: list[dict]) -> str:
        return "\n".join(f"<tool_call>\n{dumps({'name': c['name'], 'arguments': c['arguments']})}\n</tool_call>"
                         for c in calls)


class Llama3(CallFormat):
    name = "llama3"
    start_openers = ('{"name"', '{"type"')  # Llama 3.1 may write `{"type": "function", "name": ...}`
    openers = ("<|python_tag|>",)

    def _triggers(self, tools: ToolSet):
        units = call_units(tools)
        return [(AT_START, "\\{", units[1:]), (ANYWHERE, escape("<|python_tag|>"), [SP, *units])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        calls = repeated("call", tools, '";" space ')
        return f'{call_rules(tools, converter, "parameters")}\nroot ::= ("<|python_tag|>" space)? {calls}\n'

    def blocks(self, text: str) -> Iterator[Block]:
        at = self.opens_at(text)
        if at is None:
            return
        if text.startswith("<|python_tag|>", at):
            at += len("<|python_tag|>")
        first = True
        while True:  # objects separated by `;` (Llama 3.2); text after them is the reply's text
            start = skip_space(text, at, " \t\n\r" if first else " \t\n\r;")
            if start >= len(text) or text[start] != "{":
                if first:
                    yield Block(at, len(text), [], False)
                return
            decoded = decode_at(text, start)
            if decoded is None or not isinstance(decoded[0], dict) or "name" not in decoded[0]:
                yield Block(start, len(text), [], False)
                return
            obj = decoded[0]
            key = "parameters" if "parameters" in obj else "arguments"
            yield Block(start if first else at, decoded[1], [name_and(obj, key)], True)  # a `;` goes with its call
            at, first = decoded[1], False

    def find_calls(self, text: str):
        found = super().find_calls(text)
        if found is None:
            return None
        return found[0].replace("<|python_tag|>", "").strip(), found[1]

    def write(self, calls: list[dict]) -> str:
        return "; ".join(dumps({"name": c["name"], "parameters": c["arguments"]}) for c in calls)


class Granite(CallFormat):
    name = "granite"
    openers = ("<|tool_call|>",)

    def _triggers(self, tools: ToolSet):
        return [(ANYWHERE, escape("<|tool_call|>"), [SP, "\\[", SP, *call_units(tools)])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        calls = repeated("call", tools, '"," space ')
        return f'{call_rules(tools, converter)}\nroot ::= "<|tool_call|>" space "[" space {calls} "]" space\n'

    def blocks(self, text: str) -> Iterator[Block]:
        return _marked_blocks(text, "<|tool_call|>", "")

    def write(self, calls: list[dict]) -> str:
        return "<|tool_call|>" + json.dumps([{"name": c["name"], "arguments": c["arguments"]} for c in calls],
                                             ensure_ascii=False)


class Phi4(CallFormat):
    name = "phi4"
    openers = ("<|tool_call|>", "functools[")

    def _triggers(self, tools: ToolSet):
        return [(ANYWHERE, escape("<|tool_call|>"), [SP, *call_units(tools)])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        block = '"<|tool_call|>" space call "<|/tool_call|>"'
        return f"{call_rules(tools, converter)}\nroot ::= {repeated(f'({block})', tools, 'space ')}\n"

    def blocks(self, text: str) -> Iterator[Block]:
        at = 0
        while (start := self.opens_at(text, at)) is not None:
            if text.startswith("functools[", start):
                calls, end, whole = objects_from(text, start + len("functools["))
                yield Block(start, end if whole else len(text), calls, whole)
            else:
                block = next(_marked_blocks(text, "<|tool_call|>", "<|/tool_call|>", start))
                yield block
                end, whole = block.end, block.whole
            if not whole:
                return
            at = end

    def messages(self, messages: list[dict], tools: ToolSet | None) -> list[dict]:
        """Phi-4-mini's own template reads the tools from the system message's `tools` (JSON text),
        not from `tools`; llama.cpp's reads `tools`: both are given."""
        messages = super().messages(messages, tools)
        if tools is None or not self.source or "message['tools']" not in self.source:
            return messages
        listed = json.dumps([t.as_openai()["function"] for t in tools.offered()], ensure_ascii=False)
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "tools": listed}, *messages[1:]]
        return [{"role": "system", "content": "", "tools": listed}, *messages]

    def write(self, calls: list[dict]) -> str:
        return "".join(f"<|tool_call|>{dumps({'name': c['name'], 'arguments': c['arguments']})}<|/tool_call|>"
                       for c in calls)

