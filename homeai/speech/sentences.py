"""An answer as speakable sentences: Markdown removed, cut where a listener hears a sentence end.

Pure (no speech library). `speakable(text)` is what a voice should say for a text: emphasis,
inline code, links (their text), images (their alt text), headings' and list items' markers,
block quotes, tables' pipes, HTML tags and horizontal rules removed, fenced code blocks left out
(code read aloud helps nobody), URLs shortened to their host, spaces collapsed. `Sentences` cuts
text arriving token by token into whole sentences, each made speakable, so each can be
synthesised as soon as it is complete:

    cutter = Sentences()
    for piece in answer:                  # "The answer is 3.", "5. Dr. Smith agrees", "!\\n"
        for sentence in cutter.feed(piece):
            speak(sentence)               # "The answer is 3.5.", "Dr. Smith agrees!"
    for sentence in cutter.flush():
        speak(sentence)

A sentence ends at ".", "!" or "?" followed by a space (closing quotes, brackets and emphasis
markers go with it), at the end of a line (a heading, a list item, a table row, a paragraph),
and nowhere else: not in "3.5", not after "e.g.", "Dr.", "U.S.", a single initial or a list's
"1.", nor before a word in lower case ("approx. five"). A "." followed by a space is decided
when the next word's first letter arrives. A sentence longer than `SOFT_MAX` characters is cut
at its next comma, semicolon or colon, one over `HARD_MAX` at its last space.

`Sentences(first_clause=N)` speaks sooner: until a first piece has been cut, a clause of at least N
characters ending at a comma, semicolon or colon followed by a space is one ("In Tokyo, it is
9:15," then "which is 10:30 in Berlin."), so a spoken answer's first audio waits for its first
clause, not its whole first sentence. Later sentences are cut whole, as the listener hears them.
"""

from __future__ import annotations

import re

SOFT_MAX = 200  # past this, a sentence is cut at its next comma, semicolon or colon
HARD_MAX = 400  # past this, at its last space

# Words whose "." never ends a sentence, and those whose "." ends one only before a capital.
TITLES = {"dr", "mr", "mrs", "ms", "prof", "st", "sr", "jr", "mt", "vs", "e.g", "i.e", "cf", "fig", "no",
          "approx", "ca", "inc", "ltd", "co", "dept", "est", "vol", "ed", "eg", "ie"}
MAYBE_FINAL = {"etc", "a.m", "p.m", "am", "pm"}

FENCE = re.compile(r"^\s*(```|~~~)")
END = re.compile(r"[.!?…]+[\"'”’)\]*_~`]*(?=\s|$)")
LONG_CUT = re.compile(r"[,;:]\s")

_LINE_MARKERS = [
    (re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$"), ""),                 # a horizontal rule
    (re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$"), ""),  # a table's separator row
    (re.compile(r"^\s*(>\s*)+"), ""),                                 # block quotes
    (re.compile(r"^\s*#{1,6}\s+"), ""),                               # headings
    (re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+(\[[ xX]\]\s+)?"), ""),  # list items, task boxes
]
_INLINE = [
    (re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])"), r"\1"),               # escapes
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),                    # images: their alt text
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),                     # links: their text
    (re.compile(r"\[([^\]]+)\]\[[^\]]*\]"), r"\1"),                    # reference links
    (re.compile(r"\[\^[^\]]*\]"), ""),                                 # footnote marks
    (re.compile(r"<(https?://[^>\s]+)>"), r"\1"),                      # autolinks
    (re.compile(r"</?[A-Za-z][^<>]*>"), ""),                           # HTML tags
    (re.compile(r"https?://(?:www\.)?([^/\s?#)]+)(?:[^\s)]*[^\s).,;:!?'\"])?"), r"\1"),  # URLs: their host
    (re.compile(r"`+([^`]*)`+"), r"\1"),                               # inline code
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),             # strong
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),  # emphasis
    (re.compile(r"(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"), r"\1"),          # emphasis (not snake_case)
    (re.compile(r"~~(.+?)~~"), r"\1"),                                  # strikethrough
    (re.compile(r"\*\*|__|~~|[*`]"), ""),                               # markers left unpaired
]
_TABLE_PIPES = re.compile(r"\s*\|\s*")


def _clean_line(line: str) -> str:
    """One line (or a piece of one) made speakable."""
    for pattern, replacement in _LINE_MARKERS:
        line = pattern.sub(replacement, line)
    if line.count("|") >= 2:  # a table row: its cells, separated by commas
        line = ", ".join(cell for cell in _TABLE_PIPES.split(line) if cell)
    for pattern, replacement in _INLINE:
        line = pattern.sub(replacement, line)
    return " ".join(line.split())


def _audible(sentence: str) -> bool:
    return any(ch.isalnum() for ch in sentence)


def speakable(text: str) -> str:
    """The whole text as a voice should say it: markup removed, code blocks left out, one line."""
    kept, in_code = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        cleaned = _clean_line(line) if not in_code else ""
        if _audible(cleaned):
            # A heading or list item has no full stop: one keeps it from running into the next line.
            kept.append(cleaned if cleaned[-1] in ".!?,;:…" else cleaned + ".")
    if len(kept) == 1 and text.strip() and not text.rstrip()[-1:] in ".!?…":
        kept[0] = kept[0].removesuffix(".")  # one line given without a stop: none added
    return " ".join(kept)


def _word_before(text: str, end: int) -> str:
    """The word ending at `end` (an opening bracket or quote left off), in lower case."""
    match = re.search(r"(\S+)$", text[:end])
    return match.group(1).lstrip("([\"'“‘*_").lower() if match else ""


def _ends_sentence(text: str, match: re.Match, *, line_start: bool, final: bool) -> bool | None:
    """Whether END's match ends a sentence; None while the next word has not arrived to say."""
    if match.end() == len(text):  # more of it may follow ("?!", "3.5", a closing quote)
        return True if final else None
    if "." not in match.group() or any(ch in match.group() for ch in "!?…"):
        return True
    after = text[match.end():].lstrip()
    if not after:
        return True if final else None
    word = _word_before(text, match.start())
    capital = after[0].isupper() or not after[0].isalpha()
    if word in TITLES or (len(word) == 1 and word.isalpha()) or re.fullmatch(r"([a-z]\.)+[a-z]", word):
        return word in MAYBE_FINAL and after[0].isupper()
    if word in MAYBE_FINAL:
        return after[0].isupper()
    if line_start and re.fullmatch(r"\s*\d{1,3}", text[:match.start()]):
        return False  # "1. " opening a list item
    return capital


class Sentences:
    """Incremental: text as tokens arrive in, whole speakable sentences out."""

    def __init__(self, first_clause: int | None = None) -> None:
        self._first_clause = first_clause  # a first clause this long is cut early (None: never)
        self._pending = ""  # the current line's text not yet cut off
        self._line_start = True  # whether `_pending` begins its line
        self._in_code = False  # inside a fenced code block (not spoken)

    def feed(self, text: str) -> list[str]:
        """The sentences this text completed, speakable and non-empty."""
        self._pending += text
        out: list[str] = []
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            out += self._whole_line(line)
        if not self._in_code and not (self._line_start and _may_open_fence(self._pending)):
            pieces, self._pending = _cut(self._pending, line_start=self._line_start, final=False)
            if not pieces and not out and self._first_clause and (cut := self._clause_end()) is not None:
                pieces, self._pending = [self._pending[:cut]], self._pending[cut:]
            self._line_start = self._line_start and not pieces
            out += _speakable_pieces(pieces)
        if out:
            self._first_clause = None  # the first piece is out: the rest go whole
        return out

    def _clause_end(self) -> int | None:
        """Where the pending text's first clause ends, if it is long enough to be spoken alone."""
        match = LONG_CUT.search(self._pending, self._first_clause)
        return match.end() if match and _audible(_clean_line(self._pending[:match.end()])) else None

    def flush(self) -> list[str]:
        """What is left at the end of the text."""
        line, self._pending = self._pending, ""
        out = self._whole_line(line)
        self._in_code = False
        self._first_clause = None
        return out

    def _whole_line(self, line: str) -> list[str]:
        """The rest of a line, all of it known; the next text starts a line."""
        line_start, self._line_start = self._line_start, True
        if line_start and FENCE.match(line):
            self._in_code = not self._in_code
            return []
        if self._in_code:
            return []
        pieces, _ = _cut(line, line_start=line_start, final=True)
        out = _speakable_pieces(pieces)
        if out:
            self._first_clause = None
        return out


def _may_open_fence(text: str) -> bool:
    """Whether a line beginning with `text` may turn out to be a code fence."""
    start = text.lstrip()
    return start[:3] in ("```"[:len(start)], "~~~"[:len(start)])


def _speakable_pieces(pieces: list[str]) -> list[str]:
    return [s for s in map(_clean_line, pieces) if _audible(s)]


def _cut(text: str, *, line_start: bool, final: bool) -> tuple[list[str], str]:
    """Whole sentences cut off `text`, and the rest; with `final`, the text's end is one too."""
    start, pieces = 0, []
    for match in END.finditer(text):
        ends = _ends_sentence(text, match, line_start=line_start and start == 0, final=final)
        if ends is None:
            break
        if ends:
            pieces.append(text[start:match.end()])
            start = match.end()
    rest = text[start:]
    while len(rest) > SOFT_MAX and (cut := _long_cut(rest)) is not None:
        pieces.append(rest[:cut])
        rest = rest[cut:]
    if final:
        return pieces + [rest], ""
    return pieces, rest


def _long_cut(text: str) -> int | None:
    """Where to cut a sentence too long to wait for its end, or None to wait on."""
    match = LONG_CUT.search(text, SOFT_MAX)
    if match:
        return match.end()
    if len(text) > HARD_MAX:
        space = text.rfind(" ", 0, HARD_MAX)
        return space + 1 if space > 0 else HARD_MAX
    return None
