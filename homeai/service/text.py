"""Text a client sends must be text: every string of a request valid Unicode.

JSON's `\\ud800` escapes can spell a lone surrogate, which UTF-8 cannot encode and the tokenizer
cannot take; `find_invalid_text` finds the first in a parsed request, for the protocol to refuse
it (OpenAI and Ollama bodies, voice socket frames, Wyoming events).
"""

from __future__ import annotations

import re
from typing import Any

SURROGATE = re.compile("[\ud800-\udfff]")


def find_invalid_text(value: Any) -> str | None:
    """Where in a parsed JSON value the first string or key that is not valid Unicode is, as a
    dotted path ("messages.0.content"; "" for the value itself); None when all text is valid.
    Iterative: a body nested hundreds deep must not exhaust the stack."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if SURROGATE.search(item):
                return _dotted(path)
        elif isinstance(item, dict):
            for key in item:
                if SURROGATE.search(key):
                    return _dotted((*path, key))
            stack.extend((child, (*path, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((child, (*path, i)) for i, child in reversed(list(enumerate(item))))
    return None


def _dotted(path: tuple) -> str:
    # A key may itself hold the surrogate: escaped, the path can go into a JSON answer.
    return ".".join(str(part).encode("utf-8", "backslashreplace").decode("utf-8") for part in path)
