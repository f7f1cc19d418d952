"""TextStream against a whole-text reference: however a reply's bytes are cut into tokens, the text
sent is the whole reply decoded at once (a character the reply cut short dropped, bad bytes as
U+FFFD), up to the first stop string; with no stop string each token's text goes at once."""

from __future__ import annotations

import codecs
import random

import pytest

from homeai.engine.text import TextStream

ALPHABET = ["a", "b", " ", "é", "こ", "😀", "EN", "D"]


def _reply(rng: random.Random) -> bytes:
    data = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30))).encode()
    if rng.random() < 0.3:  # a byte no character starts with, shown as U+FFFD
        at = rng.randint(0, len(data))
        data = data[:at] + b"\xff" + data[at:]
    return data


def _cut(rng: random.Random, data: bytes) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(rng.randint(0, 8), max(len(data) - 1, 0))))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])] if data else []


def _whole(data: bytes, stop: str | None) -> tuple[str, bool]:
    text = codecs.utf_8_decode(data, "replace", False)[0]  # final=False: a cut-short character dropped
    at = text.find(stop) if stop else -1
    return (text[:at], True) if at >= 0 else (text, False)


@pytest.mark.parametrize("stop", [None, "END", "é"])
def test_the_text_sent_is_the_whole_reply_decoded_at_once(stop):
    rng = random.Random(7)
    for _ in range(2000):
        data = _reply(rng)
        stream = TextStream((stop,) if stop else ())
        sent, stopped = [], False
        for piece in _cut(rng, data):
            delta, stopped = stream.add(piece)
            sent.append(delta)
            if stopped:
                break
        sent.append(stream.flush())
        assert ("".join(sent), stopped) == _whole(data, stop), data


def test_without_stop_strings_each_token_sends_its_own_text_at_once():
    stream = TextStream()
    assert stream.add(b"ab") == ("ab", False)
    assert stream.add("é".encode()[:1]) == ("", False)  # half a character waits for its rest
    assert stream.add("é".encode()[1:] + b"c") == ("éc", False)
    assert stream.text == "abéc"
    assert stream.flush() == ""


def test_a_stop_string_holds_back_its_length_less_one():
    stream = TextStream(("END",))
    assert stream.add(b"abE") == ("a", False)  # "bE" could begin END
    assert stream.add(b"N") == ("b", False)
    assert stream.add(b"xE") == ("EN", False)
    assert stream.add(b"N") == ("x", False)
    assert stream.add(b"D!") == ("", True)
    assert stream.text == "abENx"
    assert stream.flush() == ""
