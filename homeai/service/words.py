"""Where the server cuts an answer, it ends between words (issue 54).

A request that names no answer length runs to its end of turn, or to its lane's cap where the
household set one (`[lanes.<lane>] max_tokens`), or to the room left in its cache: the last two
are the server's cut, not the client's, and they end with "length" and never inside a word. Text
already sent cannot be taken back, so within the last `HOLD_TOKENS` tokens before the cut the word
being written is held back until it ends (at whitespace, or after an ideograph, a word of its
own); the word the cut falls in is dropped. A word already being sent when the hold began (one
longer than `HOLD_TOKENS` tokens: a long URL) is sent as far as it came: cutting the rest too
would not mend it. Characters are never split (`homeai.engine.text` keeps a token's part of one).

A request that names its own length (`max_tokens`, `num_predict`) is cut where it asked, as
OpenAI and Ollama cut it: `between_words` leaves its stream as it is.
"""

from __future__ import annotations

import dataclasses
import unicodedata

from homeai.engine.engine import FinishEvent, RequestStream, TokenEvent

HOLD_TOKENS = 32  # the last tokens before a cut in which a word is held until it ends
IDEOGRAPHIC = ("Lo", "Po", "Ps", "Pe")  # wide letters (CJK, kana) and their punctuation: each a word's end


def between_words(stream: RequestStream, named: int | None) -> "RequestStream | WordCut":
    """`stream`, ending between words when the server chose its length (`named`: the length the
    request named, None for none)."""
    return stream if named is not None else WordCut(stream)


def is_break(ch: str) -> bool:
    """Whether a word may end right after `ch`."""
    return ch.isspace() or (unicodedata.east_asian_width(ch) in ("W", "F")
                            and unicodedata.category(ch) in IDEOGRAPHIC)


def last_break(text: str) -> int:
    """The length of `text`'s longest prefix that ends between words (0: none does)."""
    for i in range(len(text) - 1, -1, -1):
        if is_break(text[i]):
            return i + 1
    return 0


class WordCut:
    """A request's events, its text held back near its cap so that a cut falls between words. Read as
    the engine's `RequestStream` is (asynchronously, once); its `finished` is the end it sent."""

    def __init__(self, stream: RequestStream):
        self.stream = stream
        self.hold_from = stream.request.max_tokens - HOLD_TOKENS  # the cap: the lane's or the cache's room
        self.count = 0
        self.held = ""  # the word being written, not yet sent
        self.clean = True  # the text sent so far ends between words (or is none)
        self.finished: FinishEvent | None = None

    @property
    def request(self):
        return self.stream.request

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    def abort(self) -> None:
        self.stream.abort()

    def __aiter__(self):
        return self._events()

    async def _events(self):
        async for event in self.stream:
            if isinstance(event, TokenEvent):
                yield self._token(event)
            else:
                self.finished = self._end(event)
                yield self.finished

    def _token(self, event: TokenEvent) -> TokenEvent:
        self.count += 1
        if self.count <= self.hold_from:  # far from the cap: every token's text goes as it comes
            if event.text:
                self.clean = is_break(event.text[-1])
            return event
        text = self.held + event.text
        cut = last_break(text)
        if not self.clean and not cut:  # a word begun before the hold, still going: nothing to mend
            return event
        send, self.held = text[:cut], text[cut:]
        self.clean = self.clean or bool(send)
        return event if send == event.text else event._replace(text=send)

    def _end(self, finish: FinishEvent) -> FinishEvent:
        """The end, with the word held back: sent, or dropped when the cap cut it."""
        text, self.held = self.held + finish.text, ""
        if finish.reason == "length":
            cut = last_break(text)
            if self.clean or cut:
                text = text[:cut]
        return finish if text == finish.text else dataclasses.replace(finish, text=text)
