"""Who wrote which part of a chat prompt, and the messages as templates expect them.

A rendered prompt is a `ChatPrompt` of `Part`s, each with its `Source`: the template's own text
(its control tokens parsed), text the server wrote, the client's text (tool definitions and
leading system messages) and members' text; the runner tokenizes all but the first as plain text.
`Marks` wraps every string a member wrote in random markers for one rendering and splits the
rendered text on them (the rules: homeai/engine/template.py's docstring). `PromptTokens` carries
how many leading tokens no member, and no user, wrote: what the prompt cache may share.
`for_template` shapes an OpenAI message as chat templates expect it, before it is marked.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from lanes.base import ServerText


def for_template(message: dict) -> dict:
    """A message as chat templates expect it. OpenAI sends a tool call's `arguments` as a JSON string;
    templates (Qwen 2.5, Hermes, Llama 3.x, Mistral) write them with `| tojson`, so they need the
    mapping, or the prompt would hold a quoted string. An empty or null `tool_calls` is dropped:
    Llama 3.x tests `'tool_calls' in message` and would take a plain answer for a call. A null
    `content` (OpenAI clients send one beside a call) is "", as llama-server gives it: Qwen3's and
    gpt-oss's templates test `'<think>' in content` and fail on null."""
    if "content" in message and message["content"] is None:
        message = {**message, "content": ""}
    calls = message.get("tool_calls")
    if "tool_calls" not in message or (calls and not isinstance(calls, list)):
        return message
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if calls:
        out["tool_calls"] = [_call_for_template(c) for c in calls]
    return out


def _call_for_template(call):
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return call  # not JSON: the template gets the text as sent
    if not isinstance(parsed, dict):
        return call
    return {**call, "function": {**function, "arguments": parsed}}


# ---- who wrote which part of a prompt ----------------------------------------------------


class Source(enum.Enum):
    TEMPLATE = "template"  # the chat template's own text: its control tokens are control tokens
    SERVER = "server"  # text the server wrote (a lane's configured prompt): plain text, no member's
    # the client's own text before any user's (tool definitions, leading system messages): plain
    # text, its member's; shared only among the users of one trusted proxy
    CLIENT = "client"
    MEMBER = "member"  # what a member, a user, a tool or a document wrote: plain text, that member's


CLIENT_ROLES = ("system", "developer")  # the roles of the leading messages a client writes


@dataclass(frozen=True)
class Part:
    text: str
    source: Source


# Where a message's i-th image sits in its text (`image_mark(i)`): a secret of this process, so no
# member's text can name an image; the runner's tokenizer puts the image's tokens there
# (`homeai.llama.vision`). Images the template or a fit dropped are not read.
_IMAGE_SECRET = secrets.token_hex(12)
IMAGE_MARK = re.compile(rf"<__image_{_IMAGE_SECRET}_(\d+)__>")


def image_mark(index: int) -> str:
    return f"<__image_{_IMAGE_SECRET}_{index}__>"


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat prompt, in the parts the runner tokenizes apart, and the images its marks name."""

    parts: tuple[Part, ...]
    images: tuple = ()  # homeai.service.images.Picture, the i-th where `image_mark(i)` is
    holder: str = ""  # who holds its images' embeddings until its request is queued (one a request)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts)


class PromptTokens(list):
    """A chat prompt's tokens, how many lead it that no member wrote (`public_len`): the only part
    another member's request may share from the prompt cache; and how many lead it that no user
    wrote (`client_len`, at least `public_len`: the client's tools and system text too), which
    another user of the same trusted proxy may share. A copy or a slice is a plain list, whose
    public length is 0: nothing shared."""

    def __init__(self, tokens: Sequence[int], public_len: int, client_len: int | None = None,
                 images: tuple[tuple[int, int], ...] = (), whole_images: bool = False, holder: str = ""):
        super().__init__(tokens)
        self.public_len = public_len
        self.client_len = public_len if client_len is None else max(public_len, client_len)
        # Each image's placeholder span [start, end); whether a span is read in one step; and who holds
        # their embeddings until the request is queued (`homeai.llama.vision.Vision.hold`)
        self.images, self.whole_images, self.holder = images, whole_images, holder


# Compared or measured by templates (Mistral wants 9-character call ids), so only their control-token
# texts are wrapped; roles are checked by the API's schemas.
_STRUCTURAL = frozenset({"role", "type", "id", "tool_call_id"})
MARKED = re.compile(r"((?:\[\[\d{16}:\d+\]\])+)(.*?)((?:\[\[/\d{16}:\d+\]\])+)", re.DOTALL)
_MARKER = re.compile(r"\[\[(/?)(\d{16}):(\d+)\]\]")


class Marks:
    """Markers around the strings members wrote, for one rendering, and the rendered text split on them.

    A marker is `[[N:i]]` ... `[[/N:i]]`, N a random 16-digit number no string of the request
    holds: digits and brackets pass through `tojson`, `upper` and HTML escaping unchanged. Empty
    strings stay empty (templates test them); role and type values and mapping keys, which
    templates compare, get only their control-token texts wrapped.
    """

    def __init__(self, control_texts: Sequence[str] = (), request: object = None, client: bool = True):
        self.nonce = _nonce(repr(request))
        self.sources: list[Source] = []
        self._control = _control_pattern(tuple(control_texts))
        self.client = Source.CLIENT if client else Source.MEMBER  # the source of the client's text

    def messages(self, messages: list[dict]) -> list[dict]:
        """Each message's strings wrapped: the client's up to the first message of another role
        than `CLIENT_ROLES`, a member's from there on."""
        lead = next((i for i, m in enumerate(messages) if m.get("role") not in CLIENT_ROLES), len(messages))
        return [self._value(for_template(m), source=self.client if i < lead else Source.MEMBER)
                for i, m in enumerate(messages)]

    def tools(self, tools: list[dict] | None) -> list[dict] | None:
        return self._value(tools, source=self.client) if tools else tools

    def text(self, text: str, source: Source = Source.MEMBER) -> str:
        """`text` wrapped, each control-token text in it wrapped again."""
        if not text:
            return text
        if self._control is not None:
            text = self._control.sub(lambda m: self._wrap(m.group(), source), text)
        return self._wrap(text, source)

    def _controls(self, text: str) -> str:
        if self._control is None:
            return text
        return self._control.sub(lambda m: self._wrap(m.group(), Source.MEMBER), text)

    def _wrap(self, text: str, source: Source) -> str:
        index = len(self.sources)
        self.sources.append(source)
        return f"[[{self.nonce}:{index}]]{text}[[/{self.nonce}:{index}]]"

    def _value(self, value, key=None, source: Source = Source.MEMBER):
        if isinstance(value, str):
            if key in _STRUCTURAL:
                return self._controls(value)
            return self.text(value, Source.SERVER if isinstance(value, ServerText) else source)
        if isinstance(value, dict):
            return {self._controls(k) if isinstance(k, str) else k: self._value(v, k, source) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._value(v, source=source) for v in value]
        return value

    def split(self, text: str) -> ChatPrompt:
        """`text` in parts by who wrote them. Text inside markers is its string's; text outside
        them is the template's, except text just before a closing marker whose opening one is not
        open (the template cut a string): that is a member's."""
        parts: list[Part] = []
        open_: list[int] = []
        pos = 0
        for m in _MARKER.finditer(text):
            if m.group(2) != self.nonce:  # a member's text that looks like a marker: text
                continue
            segment = text[pos:m.start()]
            pos = m.end()
            index = int(m.group(3))
            if not m.group(1):
                _add(parts, segment, self._source(open_))
                open_.append(index)
                continue
            _add(parts, segment, self._source(open_) if open_ and open_[-1] == index else Source.MEMBER)
            if index in open_:
                del open_[open_.index(index):]
        _add(parts, text[pos:], self._source(open_))
        return ChatPrompt(tuple(parts))

    def _source(self, open_: list[int]) -> Source:
        if not open_:
            return Source.TEMPLATE
        sources = [self.sources[i] if i < len(self.sources) else Source.MEMBER for i in open_]
        return next((s for s in (Source.MEMBER, Source.CLIENT) if s in sources), Source.SERVER)


@functools.lru_cache(maxsize=8)
def _control_pattern(texts: tuple[str, ...]) -> re.Pattern | None:
    ordered = sorted({t for t in texts if t}, key=len, reverse=True)  # the longest text first
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


def _nonce(seen: str) -> str:
    while True:
        nonce = f"{secrets.randbelow(9 * 10**15) + 10**15}"
        if nonce not in seen:
            return nonce


def _add(parts: list[Part], text: str, source: Source) -> None:
    if not text:
        return
    if parts and parts[-1].source is source:
        parts[-1] = Part(parts[-1].text + text, source)
    else:
        parts.append(Part(text, source))
