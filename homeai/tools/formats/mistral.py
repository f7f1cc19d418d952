"""Mistral's `[TOOL_CALLS]`, in both its forms:

* `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "a1b2c3d4e"}, ...]` (Mistral 7B v0.3, Nemo);
* `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}` or `[TOOL_CALLS]NAME[ARGS]{...}`, one per call
  (Mistral Small 3.2, Ministral, Magistral, Devstral).

Both are read whatever the template; the grammar holds the form its template writes (`[ARGS]` in
it: the newer). Mistral's templates refuse a call id that is not 9 letters and digits, so the ids
homeai makes for these models are such, and ids in the history that are not (a client's own, or
none: Ollama's calls carry none) are replaced by ones derived from them, the same every turn.
"""

from __future__ import annotations

import re
from typing import Iterator

from homeai.tools.formats.base import SP, Block, CallFormat, RawCall, SchemaConverter, arguments_rules, call_rules, \
    call_units, decode_at, escape, literal, names_unit, objects_from, repeated, short_id, skip_space, stable_id
from homeai.tools.spec import ToolSet, dumps

OPENER = "[TOOL_CALLS]"
_NAMED = re.compile(r"([A-Za-z0-9_\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")
_ID = re.compile(r"^[A-Za-z0-9]{9}$")


class Mistral(CallFormat):
    name = "mistral"
    openers = (OPENER,)

    @property
    def named(self) -> bool:
        """The template writes the newer form, `NAME[ARGS]{...}`."""
        return bool(self.source) and "[ARGS]" in self.source

    def _triggers(self, tools: ToolSet):
        if self.named:
            return [("[\\s\\S]*?", escape(OPENER), [names_unit(tools)])]
        return [("[\\s\\S]*?", escape(OPENER), [SP, "\\[", SP, *call_units(tools)])]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        if not self.named:
            calls = repeated("call", tools, '"," space ')
            return f'{call_rules(tools, converter)}\nroot ::= "[TOOL_CALLS]" space "[" space {calls} "]" space\n'
        text, args = arguments_rules(tools, converter)
        named = " | ".join(f'{literal(t.name)} ("[CALL_ID]" [a-zA-Z0-9]{{9}})? "[ARGS]" {rule}'
                           for t, rule in zip(tools.offered(), args))
        return f'{text}\ntool-call ::= "[TOOL_CALLS]" ({named})\nroot ::= {repeated("tool-call", tools)}\n'

    def blocks(self, text: str) -> Iterator[Block]:
        at = 0
        while (start := text.find(OPENER, at)) >= 0:
            body = skip_space(text, start + len(OPENER))
            if text[body:body + 1] == "[":
                calls, end, whole = objects_from(text, body + 1, ids=True)  # each with the id the model gave it
                yield Block(start, end if whole else len(text), calls, whole)
                if not whole:
                    return
                at = end
                continue
            at = yield from self._named(text, start, body)
            if at is None:
                return

    def _named(self, text: str, start: int, body: int) -> Iterator[Block]:
        """`NAME[ARGS]{...}` calls from `body` on (several may follow one `[TOOL_CALLS]`); where they end,
        or None once one is not whole."""
        while True:
            named = _NAMED.match(text, body)
            decoded = decode_at(text, named.end()) if named else None
            if decoded is None or not isinstance(decoded[0], dict):
                yield Block(start, len(text), [], False)
                return None
            yield Block(start, decoded[1], [RawCall(named.group(1), decoded[0], named.group(2))], True)
            start = body = decoded[1]
            if not _NAMED.match(text, body):
                return body

    def new_id(self) -> str:
        return short_id()

    def messages(self, messages: list[dict], tools: ToolSet | None) -> list[dict]:
        """Call ids the template takes: 9 letters and digits. A result without an id answers the
        earliest call not yet answered."""
        out, pending = [], []
        for i, message in enumerate(messages):
            if message.get("role") == "assistant" and message.get("tool_calls"):
                calls = [{**c, "id": _id_for(c.get("id"), f"{j} {c.get('function')}")}
                         for j, c in enumerate(message["tool_calls"])]
                pending += [c["id"] for c in calls]
                out.append({**message, "tool_calls": calls})
            elif message.get("role") == "tool":
                given = message.get("tool_call_id")
                ident = _id_for(given, "") if given else (pending[0] if pending else stable_id(f"result {i}"))
                pending = [p for p in pending if p != ident]
                out.append({**message, "tool_call_id": ident})
            else:
                out.append(message)
        return super().messages(out, tools)

    def write(self, calls: list[dict]) -> str:
        if self.named:
            return "".join(f"{OPENER}{c['name']}[ARGS]{dumps(c['arguments'])}" for c in calls)
        return OPENER + dumps([{"name": c["name"], "arguments": c["arguments"]} for c in calls])


def _id_for(given: object, where: str) -> str:
    """The id as Mistral's template takes it: a valid one kept, another mapped to one of its own."""
    if isinstance(given, str) and _ID.match(given):
        return given
    return stable_id(given if isinstance(given, str) and given else f"call {where}")
