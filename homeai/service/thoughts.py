"""A reply's thoughts split from its answer as it streams: `TagSplitter` for thoughts in tags
(`<think>`, Magistral's `[THINK]`, Granite's `<response>` answer tags), `HarmonySplitter` for
gpt-oss's channels. Which one a reply gets, and why, is homeai/service/thinking.py's to say
(`thinking.splitter`); the rules are in its docstring. Pieces may be split anywhere, inside a tag
too: the same text gives the same thoughts and content however it is split.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class Splitter:
    """Text pieces in, (thinking, content) pieces out; `finish()` gives what was held back."""

    def feed(self, text: str) -> tuple[str, str]:
        raise NotImplementedError

    def finish(self) -> tuple[str, str]:
        raise NotImplementedError


def _held(text: str, tags: Sequence[str]) -> int:
    """How many characters at the end of `text` may begin one of `tags` (held until decided)."""
    for n in range(min(len(text), max(map(len, tags)) - 1), 0, -1):
        tail = text[-n:]
        if any(tag.startswith(tail) for tag in tags):
            return n
    return 0


class TagSplitter(Splitter):
    """A thought in open/close tags where the reply starts (or from the start, when the prompt opened
    it: `thinking`), then content. White space around a thought is left out; so are `answer_tags`."""

    def __init__(self, open_: str, close: str, *, thinking: bool = False, answer_tags: tuple[str, ...] = ()):
        self.open, self.close, self.answer_tags = open_, close, answer_tags
        self.state = "opened" if thinking else "start"  # start | opened | lead | thinking | after | content
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        thought, content = [], []
        while self._step(thought, content):
            pass
        return "".join(thought), "".join(content)

    def finish(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state in ("opened", "lead", "thinking"):
            return rest.strip(), ""
        if self.state == "after":
            return "", rest.lstrip()
        return "", rest

    def _step(self, thought: list[str], content: list[str]) -> bool:
        """One decision on the buffer; False once it must wait for more text."""
        buf = self.buf
        if self.state in ("start", "opened"):
            head = buf.lstrip()
            if head.startswith(self.open):  # the thought's tag (once more, when the prompt opened it)
                self.buf, self.state = head[len(self.open):], "lead"
                return True
            if self.open.startswith(head):
                return False  # white space, or the tag's first characters: not decided yet
            self.state = "thinking" if self.state == "opened" else "content"
            if self.state == "thinking":
                self.buf = head
            return True
        if self.state in ("lead", "after"):  # white space after a tag is left out
            head = buf.lstrip()
            self.buf = head
            if not head:
                return False
            self.state = "thinking" if self.state == "lead" else "content"
            return True
        if self.state == "thinking":
            end = buf.find(self.close)
            if end >= 0:
                thought.append(buf[:end].rstrip())
                self.buf, self.state = buf[end + len(self.close):], "after"
                return True
            keep = len(buf) - _held(buf, (self.close,))
            said = buf[:keep].rstrip()  # white space at the end waits: it may come before the close tag
            thought.append(said)
            self.buf = buf[len(said):]
            return False
        return self._content(content)

    def _content(self, content: list[str]) -> bool:
        buf = self.buf
        if not self.answer_tags:
            content.append(buf)
            self.buf = ""
            return False
        found = [(buf.find(tag), tag) for tag in self.answer_tags if tag in buf]
        if found:
            at, tag = min(found)
            content.append(buf[:at])
            self.buf = buf[at + len(tag):]
            return True
        keep = len(buf) - _held(buf, self.answer_tags)
        content.append(buf[:keep])
        self.buf = buf[keep:]
        return False


# ---- gpt-oss harmony ---------------------------------------------------------------------

_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")
MAX_HEADER = 256  # a header this long without `<|message|>` is not one: the text is content
_RECIPIENT = re.compile(r"\bto=\S")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class HarmonySplitter(Splitter):
    """A harmony reply, message by message. The prompt ends `<|start|>assistant`, so the first
    message's header starts the reply; each later one starts `<|start|>`."""

    def __init__(self):
        self.buf = ""
        self.header: str | None = ""  # the header being read; None inside a message's body
        self.route = "content"  # where the body goes: "thinking" | "content" | "call"
        self.pending_call = ""  # a call's header, sent to content with its body's first text

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        out = {"thinking": [], "content": []}
        while self._step(out):
            pass
        return "".join(out["thinking"]), "".join(out["content"])

    def finish(self) -> tuple[str, str]:
        out = {"thinking": [], "content": []}
        rest, self.buf = self.buf, ""
        if self.header is not None:
            header = self.header + rest
            self.header = None
            if _RECIPIENT.search(header):  # a call cut short in its header: the tool parser says what it is
                out["content"].append(self._verbatim(header))
            elif not _looks_like_header(header):
                out["content"].append(header)
        else:
            self._body(rest, out)
        return "".join(out["thinking"]), "".join(out["content"])

    def _step(self, out: dict) -> bool:
        if self.header is not None:
            return self._read_header()
        buf = self.buf
        ends = [(buf.find(m), m) for m in ("<|end|>", "<|start|>", "<|channel|>") if m in buf]
        if ends:
            at, marker = min(ends)
            self._body(buf[:at], out)
            if marker == "<|end|>":
                if self.route == "call":
                    out["content"].append(marker)
                self.buf = buf[at + len(marker):]
            else:
                self.buf = buf[at:]
            self.header = ""
            return True
        keep = len(buf) - _held(buf, _MARKERS)
        self._body(buf[:keep], out)
        self.buf = buf[keep:]
        return False

    def _read_header(self) -> bool:
        header = self.header + self.buf
        at = header.find("<|message|>", 0, MAX_HEADER + len("<|message|>"))
        if at < 0:
            if len(header) < MAX_HEADER:
                self.header, self.buf = header, ""
                return False
            self.header, self.buf, self.route = None, header, "content"  # not a header: plain text
            return True
        head = header[:at]
        self.header, self.buf = None, header[at + len("<|message|>"):]
        self.route = self._route(head)
        if self.route == "call":
            self.pending_call = self._verbatim(head) + "<|message|>"
        return True

    def _route(self, head: str) -> str:
        if _RECIPIENT.search(head):
            return "call"
        channel = _CHANNEL.search(head)
        name = channel.group(1) if channel else ""
        if name in ("final", "commentary") or (not channel and not _looks_like_header(head)):
            return "content"
        return "thinking"

    def _verbatim(self, head: str) -> str:
        """A call's header as the tool parser reads it: from `<|channel|>` when the recipient follows
        it, else whole from `<|start|>` (the first message's `<|start|>assistant` is in the prompt)."""
        channel = head.find("<|channel|>")
        recipient = _RECIPIENT.search(head)
        if channel >= 0 and recipient is not None and recipient.start() > channel:
            return head[channel:]
        head = head.lstrip() if head.startswith((" ", "to=")) else head
        if not head.startswith("<|start|>"):
            head = "<|start|>assistant " + head if head.startswith("to=") else "<|start|>assistant" + head
        return head

    def _body(self, text: str, out: dict) -> None:
        if self.pending_call:
            out["content"].append(self.pending_call)
            self.pending_call = ""
        if text:
            out["content" if self.route in ("content", "call") else "thinking"].append(text)


def _looks_like_header(text: str) -> bool:
    return "<|channel|>" in text or text.lstrip().startswith(("<|start|>", "to="))
