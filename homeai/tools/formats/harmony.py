"""gpt-oss's harmony: a call is a message in the commentary channel addressed to the function,

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>

`<|call|>` ends generation, so it never appears: a call may end at the end of the text. The
thinking splitter (homeai.service.thinking) routes the channels: the analysis channel to thinking,
the final channel's text to content, and a commentary block that calls a function verbatim to
content, which is what this format reads. The template renders earlier calls itself.

No grammar holds it: the call's arguments start after a header whose parts vary (the recipient
before or after the channel, `<|constrain|>` or a bare `json`), inside markup the splitter routes,
so a trigger could not be made a prefix of what a grammar takes. Its calls are parsed and each
checked against its tool's schema.
"""

from __future__ import annotations

import re
from typing import Iterator

from homeai.tools.formats.base import Block, CallFormat, RawCall, decode_at, skip_space
from homeai.tools.spec import ToolSet

_HEADER = re.compile(r"(?:<\|start\|>assistant)?(?:<\|channel\|>commentary)? ?to=functions\.([A-Za-z0-9_\-.]+)"
                     r"(?:<\|channel\|>commentary)?[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>")


class Harmony(CallFormat):
    name = "harmony"
    openers = ("<|channel|>commentary to=functions.", "<|start|>assistant to=functions.")

    def grammar(self, tools: ToolSet) -> None:
        return None

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
