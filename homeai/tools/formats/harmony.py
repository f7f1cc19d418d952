"""gpt-oss's harmony: a call is a message in the commentary channel addressed to the function,

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>

`<|call|>` ends generation, so it never appears: a call may end at the end of the text. The
thinking splitter (homeai.service.thinking) routes the channels: the analysis channel to thinking,
the final channel's text to content, and a commentary block that calls a function verbatim to
content, which is what this format reads. The template renders earlier calls itself.

Its grammar starts at either header (the raw output's, before the splitter routes it) and holds
the header's rest, `<|constrain|>json` or a bare `json` or neither, then the named tool's
arguments; `<|call|>` ends the reply there. A call from the reply's very start, whose
`<|start|>assistant` is the prompt's (` to=functions.NAME<|channel|>...`), is parsed and checked,
not held. One call a reply: generation ends at `<|call|>`.
"""

from __future__ import annotations

import re
from typing import Iterator

from homeai.tools.formats.base import Block, CallFormat, RawCall, SchemaConverter, arguments_rules, decode_at, escape, \
    literal, names_unit, skip_space
from homeai.tools.spec import ToolSet, dumps

CHANNEL_FIRST = "<|channel|>commentary to=functions."
RECIPIENT_FIRST = "<|start|>assistant to=functions."

_HEADER = re.compile(r"(?:<\|start\|>assistant)?(?:<\|channel\|>commentary)? ?to=functions\.([A-Za-z0-9_\-.]+)"
                     r"(?:<\|channel\|>commentary)?[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>")


class Harmony(CallFormat):
    name = "harmony"
    openers = (CHANNEL_FIRST, RECIPIENT_FIRST)

    def _triggers(self, tools: ToolSet):
        return [("[\\s\\S]*?", escape(opener), [names_unit(tools)]) for opener in self.openers]

    def _root(self, tools: ToolSet, converter: SchemaConverter) -> str:
        text, args = arguments_rules(tools, converter)
        names = [literal(t.name) for t in tools.offered()]
        channel_first = " | ".join(f"{name} header-rest {rule}" for name, rule in zip(names, args))
        recipient_first = " | ".join(f'{name} "<|channel|>commentary" header-rest {rule}'
                                     for name, rule in zip(names, args))
        return (f'{text}\nheader-rest ::= " "? ("<|constrain|>"? "json" " "?)? "<|message|>"\n'
                f"channel-first ::= {literal(CHANNEL_FIRST)} ({channel_first})\n"
                f"recipient-first ::= {literal(RECIPIENT_FIRST)} ({recipient_first})\n"
                "root ::= channel-first | recipient-first\n")

    def blocks(self, text: str) -> Iterator[Block]:
        at = 0
        while (start := self.opens_at(text, at)) is not None:
            header = _HEADER.match(text, start)
            body = skip_space(text, header.end()) if header else len(text)
            decoded = decode_at(text, body) if text[body:body + 1] == "{" else None
            if decoded is None or not isinstance(decoded[0], dict):
                yield Block(start, len(text), [], False)
                return
            end = next((decoded[1] + len(m) for m in ("<|call|>", "<|end|>") if text.startswith(m, decoded[1])),
                       decoded[1])  # the message's end, when the splitter passes it on
            yield Block(start, end, [RawCall(header.group(1), decoded[0])], True)
            at = end

    def write(self, calls: list[dict]) -> str:
        """Calls as the splitter hands them on (gpt-oss's template renders history's calls itself)."""
        return "".join(f"{CHANNEL_FIRST}{c['name']} <|constrain|>json<|message|>{dumps(c['arguments'])}" for c in calls)
