"""Token bytes to text for one request: incremental UTF-8 and stop strings held back until sure.

A token may hold part of a character (byte-level vocabularies split most CJK characters and emoji
across two or three tokens). The decoder keeps such a part until the rest comes; if the reply ends
first (max_tokens, a stop string, an abort), the part is dropped: a client gets whole characters,
never U+FFFD for a character the model did not finish.

`add` runs for every token of every sequence on the engine thread: the bytes are decoded by the
codec's own C function (what `codecs`' incremental decoder calls, without its two Python calls),
and a request without stop strings, which holds nothing back, sends each token's text as it is.
"""

from __future__ import annotations

from codecs import utf_8_decode


class TextStream:
    def __init__(self, stop: tuple[str, ...] = ()):
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pending = b""  # the start of a character whose rest has not come yet
        self.text = ""
        self.sent = 0

    def add(self, piece: bytes) -> tuple[str, bool]:
        """Feed a token's bytes; the text now safe to send, and whether a stop string ended it."""
        data = self.pending + piece if self.pending else piece
        new, used = utf_8_decode(data, "replace", False)
        self.pending = data[used:] if used < len(data) else b""
        self.text += new
        if not self.stop:  # nothing held back: all of it goes
            self.sent = len(self.text)
            return new, False
        for s in self.stop:
            idx = self.text.find(s, max(self.sent - len(s) + 1, 0))
            if idx >= 0:
                self.text = self.text[:idx]
                return self._take(len(self.text)), True
        return self._take(len(self.text) - self.hold), False

    def flush(self) -> str:
        """The rest of the text at the end of the request, less a character the reply cut short."""
        self.pending = b""  # it holds only the start of a valid character, never invalid bytes
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self.sent:
            return ""
        delta = self.text[self.sent:end]
        self.sent = end
        return delta
