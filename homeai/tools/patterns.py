"""What a schema's `pattern` may ask of llama.cpp, read from the pattern itself (issue 55).

llama.cpp holds a grammar as a set of stacks, one per way of reading the text so far, and weighs a
token by walking its characters down every stack that takes them, each way that takes a character
trying the next one anew: a token costs the number of ways its characters can be read. A repetition
nested in a repetition (`(([a-z])+)+`) reads the same letters in exponentially many ways (8x a
level: 17 ms, 150 ms, 1.2 s a token at depths 3, 4, 5; 260 s at depth 8), and so does an
alternation whose branches take the same characters, repeated
(`([a-df-z]|[a-df-z]|[a-df-z]|[a-df-z])+`: 5.6 s). So a pattern is taken only when its cost is
bounded by construction:

* Inside a repeated group (`*`, `+`, `{n}`, `{m,}`, `{m,n}` with n > 1) every choice is decided by
  the next character: the group does not match the empty text; its alternatives start with
  different characters; and an optional or repeated part in it starts with no character that may
  come right after it (in the group, the group's own start when it repeats, or what follows the
  group). A character inside is then read one way only, whatever the nesting: `([a-z0-9-]+[.])+`
  is taken, `(([a-z])+)+` (write `([a-z])+`), `(a|ab)+` and `(aa?)+` are not.
* Outside repeated groups a choice may stay open past the next character, each such repetition or
  optional part a place the text may be split (`[a-z]*[a-z]`, `x?x?`): a token then costs a power
  of its length, not an exponential of the nesting. At most `MAX_OPEN_REPEATS` open choices may
  take the same characters at once: five `[a-z]*` in a row (4 open, the end decides the last) weigh
  a token in 18 ms here, a plain pattern 5; six 33 ms, eight 130 ms; 12 optional letters 33 ms,
  50 minutes. `[^@]+@[^@]+[.][a-z]+` leaves one open.
* Nested counts multiply (`((a{30}){30}){30}` is 27,000 letters): their product is at most
  `[grammar] max_repeat`, and an alternation offers at most `[grammar] max_enum` branches at one place.

The syntax read is what llama-cpp-python's converter writes (literals, `.`, classes, groups,
`|`, `?*+{}`); `^` and `$` only at the ends. What it cannot read is the converter's to refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_OPEN_REPEATS = 4
MAX_GROUP_DEPTH = 64  # groups within groups in one pattern (each costs the reader a few frames)
TOP = 0x10FFFF
END = ((TOP + 1, TOP + 1),)  # past Unicode: the string's closing quote, which follows the pattern
ESCAPES = {"d": ((48, 57),), "w": ((48, 57), (65, 90), (95, 95), (97, 122)), "s": ((9, 13), (32, 32)),
           "n": ((10, 10),), "t": ((9, 9),), "r": ((13, 13),), "f": ((12, 12),), "v": ((11, 11),)}


class PatternError(ValueError):
    """Why a pattern's grammar would cost too much to weigh (or cannot be read to tell)."""


def union(*sets: tuple) -> tuple:
    """Character sets as sorted, merged (lo, hi) ranges."""
    ranges = sorted(r for s in sets for r in s)
    merged: list[list[int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def complement(chars: tuple) -> tuple:
    out, at = [], 0
    for lo, hi in chars:
        if lo > at:
            out.append((at, lo - 1))
        at = max(at, hi + 1)
    return tuple(out + ([(at, TOP)] if at <= TOP else []))


def overlap(a: tuple, b: tuple) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] <= b[j][1] and b[j][0] <= a[i][1]:
            return True
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return False


@dataclass(frozen=True, eq=False)
class Node:
    """A part of the pattern: `kind` atom (`chars`), seq or alt (`parts`), rep (`parts[0]` repeated
    `low` to `high` times, None: no end). `text` is its source, for the refusal's message."""

    kind: str
    text: str
    parts: tuple = ()
    chars: tuple = ()
    low: int = 1
    high: int | None = 1
    nullable: bool = field(init=False)
    first: tuple = field(init=False)  # the characters it may start with
    every: tuple = field(init=False)  # every character it may take

    def __post_init__(self):  # what the rules ask of a part, worked out once, from its parts'
        parts = self.parts
        if self.kind == "atom":
            nullable, first, every = False, self.chars, self.chars
        elif self.kind == "alt":
            nullable, first = any(p.nullable for p in parts), union(*(p.first for p in parts))
        elif self.kind == "seq":
            nullable, first = all(p.nullable for p in parts), starts(parts, ())
        else:
            nullable = self.low == 0 or self.high == 0 or parts[0].nullable
            first = () if self.high == 0 else parts[0].first
        if self.kind != "atom":
            every = union(*(p.every for p in parts))
        for name, value in (("nullable", nullable), ("first", first), ("every", every)):
            object.__setattr__(self, name, value)

    @property
    def repeats(self) -> bool:
        """Whether this is a part matched more than once in a row (a `{1}` or `?` is not)."""
        return self.kind == "rep" and (self.high is None or self.high > 1)

    @property
    def chooses(self) -> bool:
        """Whether how many rounds it takes is the text's choice."""
        return self.kind == "rep" and self.high != self.low


def starts(parts: tuple, follow: tuple) -> tuple:
    """The characters a sequence of parts may start with, `follow` when all may match nothing."""
    out = []
    for part in parts:
        out.append(part.first)
        if not part.nullable:
            return union(*out)
    return union(*out, follow)


def follows(parts: tuple, follow: tuple) -> list:
    """What may come right after each of a sequence's parts, `follow` after the sequence (one pass
    from the end: a pattern may be thousands of parts long)."""
    out, after = [], follow
    for part in reversed(parts):
        out.append(after)
        after = union(part.first, after) if part.nullable else part.first
    return out[::-1]


# ---- reading -------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def alternation(self, depth: int) -> Node:
        start, branches = self.i, [self.sequence(depth)]
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            branches.append(self.sequence(depth))
        text = self.p[start:self.i]
        return branches[0] if len(branches) == 1 else Node("alt", text, tuple(branches))

    def sequence(self, depth: int) -> Node:
        start, parts = self.i, []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            parts.append(self.quantified(depth))
        return parts[0] if len(parts) == 1 else Node("seq", self.p[start:self.i], tuple(parts))

    def quantified(self, depth: int) -> Node:
        start, node = self.i, self.atom(depth)
        while self.i < len(self.p):
            c = self.p[self.i]
            bounds = (0, None) if c == "*" else (1, None) if c == "+" else (0, 1) if c == "?" else self.count()
            if bounds is None:
                break
            self.i += 1 if c in "*+?" else 0
            node = Node("rep", self.p[start:self.i], (node,), low=bounds[0], high=bounds[1])
        return node

    def count(self) -> tuple[int, int | None] | None:
        if not self.p.startswith("{", self.i):
            return None
        end = self.p.find("}", self.i)
        numbers = [n.strip() for n in self.p[self.i + 1:end].split(",")] if end > 0 else []
        if not 1 <= len(numbers) <= 2 or not all(n.isdigit() for n in numbers if n) or numbers == [""]:
            return None  # not a count: the converter refuses it (it reads `{,}` as `*`, and so does this)
        self.i = end + 1
        low = _number(numbers[0]) if numbers[0] else 0
        return (low, low) if len(numbers) == 1 else (low, _number(numbers[1]) if numbers[1] else None)

    def atom(self, depth: int) -> Node:
        start, c = self.i, self.p[self.i]
        self.i += 1
        if c == "(":
            if depth >= MAX_GROUP_DEPTH:
                raise PatternError(f"nests more than {MAX_GROUP_DEPTH} groups")
            inner = self.alternation(depth + 1)
            self.i += self.p.startswith(")", self.i)
            return inner
        if c == "[":
            end = self._class_end()
            return Node("atom", self.p[start:end], chars=self._class(self.p[start + 1:end - 1]))
        if c == ".":
            return Node("atom", c, chars=complement(((10, 10), (13, 13))))
        if c == "\\" and self.i < len(self.p):
            chars, self.i = _escape(self.p, self.i)
            return Node("atom", self.p[start:self.i], chars=chars)
        return Node("atom", c, chars=((ord(c), ord(c)),))

    def _class_end(self) -> int:
        """Where the class opened before `i` ends: its first `]` not escaped (as the converter reads it)."""
        i = self.i
        while i < len(self.p) and self.p[i] != "]":
            i += 2 if self.p[i] == "\\" else 1
        self.i = min(i + 1, len(self.p))
        return self.i

    @staticmethod
    def _class(body: str) -> tuple:
        negated = body.startswith("^")
        items, i = [], int(negated)
        while i < len(body):
            chars, i = _class_item(body, i)
            if i + 1 < len(body) and body[i] == "-" and _single(chars):
                high, i = _class_item(body, i + 1)
                lo, hi = chars[0][0], high[0][0]
                chars = ((min(lo, hi), max(lo, hi)),) if _single(high) else union(chars, high, ((45, 45),))
            items.append(chars)
        chars = union(*items)
        return complement(chars) if negated else chars


def _class_item(body: str, i: int) -> tuple[tuple, int]:
    if body[i] == "\\" and i + 1 < len(body):
        return _escape(body, i + 1)
    return ((ord(body[i]), ord(body[i])),), i + 1


def _number(digits: str) -> int:
    return int(digits) if len(digits) <= 18 else 10 ** 18  # past any bound, without reading 4,300 digits


def _single(chars: tuple) -> bool:
    return len(chars) == 1 and chars[0][0] == chars[0][1]


def _escape(text: str, at: int) -> tuple[tuple, int]:
    """The characters of the escape whose letter is at `at` (after its backslash), and where the next
    part begins: a class (\\d, \\W...), a control (\\n), a code (\\x41, \\u00e9), else the letter itself."""
    c = text[at]
    digits = {"x": 2, "u": 4}.get(c, 0)
    code = text[at + 1:at + 1 + digits]
    if digits and len(code) == digits and all(h in "0123456789abcdefABCDEF" for h in code):
        value = int(code, 16)
        return ((value, value),), at + 1 + digits
    if c.lower() in "dws":
        return (complement(ESCAPES[c.lower()]) if c.isupper() else ESCAPES[c]), at + 1
    return ESCAPES.get(c, ((ord(c), ord(c)),)), at + 1


def parse(pattern: str) -> Node:
    """The pattern's parts, its anchors `^` and `$` taken off."""
    anchored = len(pattern) > 1 and pattern.startswith("^") and pattern.endswith("$")
    body = pattern[1:-1] if anchored else pattern
    reader = _Reader(body)
    node = reader.alternation(0) if body else Node("seq", "")
    while reader.i < len(body):  # an unmatched `)`: read on past it, as the converter would refuse it anyway
        reader.i += 1
        node = Node("seq", body, (node, reader.alternation(0)))
    return node


# ---- the rules ---------------------------------------------------------------------------------


def check(pattern: str, max_repeat: int, max_alternatives: int) -> None:
    """Raise PatternError when the pattern's grammar is not bounded by construction (the module's rules)."""
    try:
        node = parse(pattern)
        _counts(node, 1, max_repeat)
        _alternatives(node, max_alternatives)
        _top(node, END)
        _open(node, (), END)
    except RecursionError:
        raise PatternError("nests too deeply") from None


def _counts(node: Node, product: int, max_repeat: int) -> None:
    if node.kind == "rep" and (node.high or node.low) > 1:
        product *= node.high if node.high is not None else node.low
        if product > max_repeat:
            raise PatternError(f"{node.text[:60]!r} asks for {product} rounds, its count times those of the groups "
                               f"around it; at most {max_repeat} (the [grammar] max_repeat setting)")
    for part in node.parts:
        _counts(part, product, max_repeat)


def _alternatives(node: Node, most: int) -> None:
    if node.kind == "alt" and _width(node) > most:
        raise PatternError(f"offers more than {most} alternatives at one place (the [grammar] max_enum setting)")
    for part in node.parts:
        _alternatives(part, most)


def _width(node: Node) -> int:
    if node.kind == "alt":
        return sum(_width(p) for p in node.parts)
    return _width(node.parts[0]) if node.kind == "rep" and node.low == node.high == 1 else 1


def _top(node: Node, follow: tuple) -> None:
    """Outside repeated groups: each repeated group's inside decided by the next character."""
    if node.repeats:
        body = node.parts[0]
        if body.nullable:
            raise PatternError(f"{node.text[:60]!r} repeats a group that may match nothing, which llama.cpp reads "
                               "in every way the text splits between rounds (as in (a?)* or (a{0,3}){2,}): make "
                               "the group take at least one character")
        _decided(body, union(body.first, follow), node)
    elif node.kind == "seq":
        for part, after in zip(node.parts, follows(node.parts, follow)):
            _top(part, after)
    else:
        for part in node.parts:
            _top(part, follow)


def _decided(node: Node, follow: tuple, group: Node) -> None:
    """Refuse a choice inside the repeated `group` that the next character does not decide."""
    if node.kind == "seq":
        for part, after in zip(node.parts, follows(node.parts, follow)):
            _decided(part, after, group)
    elif node.kind == "alt":
        seen: tuple = ()
        for branch in node.parts:
            if branch.nullable or overlap(seen, branch.first):
                raise _undecided(group, node, "has alternatives that may start with the same character "
                                 "(or match nothing)")
            seen = union(seen, branch.first)
        for branch in node.parts:
            _decided(branch, follow, group)
    elif node.kind == "rep":
        body = node.parts[0]
        if node.repeats and body.nullable:
            raise _undecided(group, node, "repeats a group that may match nothing")
        if node.chooses and overlap(node.first, follow):
            raise _undecided(group, node, "may stop or go on at a character that could also come after it")
        _decided(body, union(body.first, follow) if node.repeats else follow, group)


def _undecided(group: Node, part: Node, why: str) -> PatternError:
    hint = "; a repetition in a repetition is written once: (x)+, not ((x)+)+" if part.repeats else ""
    return PatternError(f"in the repeated group {group.text[:40]!r}, {part.text[:40]!r} {why}: llama.cpp would "
                        f"read its text in many ways at once, seconds a token (each choice in a repeated group "
                        f"must be decided by the next character{hint})")


def _open(node: Node, open_: tuple, follow: tuple) -> tuple:
    """The choices left open after `node` (repetitions and optional parts that `follow`, what may
    come after them, does not decide: `[a-z]*[a-z]`, `x?x?`), given those open before it; one stays
    open past a character it may take too. Refuses more than MAX_OPEN_REPEATS open at once that may
    take the same character."""
    if node.kind == "seq":
        for part, after in zip(node.parts, follows(node.parts, follow)):
            open_ = _open(part, open_, after)
        return open_
    if node.kind == "alt":
        return tuple(dict.fromkeys(r for part in node.parts for r in _open(part, open_, follow)))
    kept = open_ if node.nullable else tuple(r for r in open_ if overlap(r.every, node.every))
    if node.kind == "rep" and not node.repeats:  # `?`, `{0,1}`, a group: what is open inside it, taken or not
        inner = _open(node.parts[0], open_, follow)
        kept = tuple(dict.fromkeys((*inner, *open_))) if node.nullable else inner
    if node.chooses and overlap(node.first, follow):
        return _at_most(node, (*kept, node))
    return kept


def _at_most(node: Node, open_: tuple) -> tuple:
    for r in open_:
        if sum(overlap(q.every, r.every) for q in open_) > MAX_OPEN_REPEATS:
            raise PatternError(f"leaves more than {MAX_OPEN_REPEATS} choices open at once that may take the same "
                               f"characters (up to {node.text[:60]!r}), repetitions or optional parts the next "
                               "character does not decide: llama.cpp weighs every way to split a token between them")
    return open_
