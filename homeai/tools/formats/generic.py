"""The generic form, for templates that know no tools (the embedded SmolLM2, Gemma 3): homeai
describes the tools in the system prompt and the reply is either plain text or
`{"tool_calls": [{"name", "arguments"}]}`; earlier calls go back to the model as that JSON and
tool results as user turns.
"""

from __future__ import annotations

import re
from typing import Iterator

from homeai.tools.formats.base import SP, Block, CallFormat, SchemaConverter, call_of, call_rules, call_units, chars, \
    objects_from, repeated, skip_space
from homeai.tools.spec import ToolSet, dumps

_LIST = re.compile(r'\{\s*"tool_calls"\s*:\s*\[')


class Generic(CallFormat):
    name = "generic"
    start_openers = ('{"tool_calls"',)  # a reply that opens with `{` is a call: its grammar starts there
    tools_in_template = False

    def _triggers(self, tools: ToolSet):
        return [("[ \\t\\n]*", "\\{", [SP, *chars('"tool_calls"'), SP, ":", SP, "\\[", SP, *call_units(tools)])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        opening = '"{" space "\\"tool_calls\\"" space ":" space "[" space'
        calls = repeated("call", tools, '"," space ')
        return f'{call_rules(tools, converter)}\nroot ::= {opening} {calls} "]" space "}}" space\n'

    def blocks(self, text: str) -> Iterator[Block]:
        at = self.opens_at(text)
        bracket = _LIST.match(text, at) if at is not None else None
        if bracket is None:
            if at is not None:
                yield Block(at, len(text), [], False)
            return
        calls, end, closed = objects_from(text, bracket.end())
        brace = skip_space(text, end)
        if closed and text[brace:brace + 1] == "}":
            yield Block(at, brace + 1, calls, True)
        else:
            yield Block(at, len(text), calls, False)

    def messages(self, messages: list[dict], tools: ToolSet | None) -> list[dict]:
        return generic_messages(messages, self.system_prompt(tools) if tools is not None else None)

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


def generic_messages(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """Messages for a template that knows no tools: calls as the JSON the model writes, results as
    user turns (consecutive ones merged, for templates that insist user and assistant alternate),
    and the tools' `system_prompt`, if any, after the client's own system prompt."""
    out: list[dict] = []
    names = {}  # call id -> tool name, for results that say only the id
    for message in messages:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            calls = [call_of(c) for c in message["tool_calls"]]
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
