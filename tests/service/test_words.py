"""An answer the server cuts (its lane's cap, its cache's room) ends between words; one whose
length the request named is cut where it asked (issue 54). The rules alone, on made-up token
streams read through the service's `Answer`; the real server is tests/api/test_answer_length.py.

Run: .venv/bin/python -m pytest -q tests/service/test_words.py
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from homeai.engine.engine import FinishEvent, TokenEvent
from homeai.engine.stats import RequestStats
from homeai.service import sampling
from homeai.service.answer import Answer, Done, Text
from homeai.service.words import HOLD_TOKENS, WordCut, between_words, is_break, last_break
from lanes import chat, summaries, voice


class Stream:
    """A request's events as the engine sends them: one token event per piece, then its end."""

    def __init__(self, pieces: list[str], reason: str, max_tokens: int, held: str = ""):
        self.pieces, self.reason, self.held = pieces, reason, held
        self.request = SimpleNamespace(max_tokens=max_tokens, num_prompt_tokens=3, request_id="r1")
        self.request_id = "r1"
        self.finished = None

    def abort(self) -> None:
        pass

    async def _events(self):
        for i, piece in enumerate(self.pieces):
            yield TokenEvent(i, piece)
        stats = RequestStats("r1", "chat", "m", "generate", self.reason, 3, len(self.pieces), 0, 0.0, 0.0, 0.0, (), 0)
        self.finished = FinishEvent(self.reason, self.held, stats)
        yield self.finished

    def __aiter__(self):
        return self._events()


def read(stream) -> tuple[str, Done, list[str]]:
    """The answer's whole text, its Done and the text of each event, as a protocol reads them."""
    async def go():
        return [event async for event in Answer(stream, model="m", lane="chat")]
    events = asyncio.run(go())
    texts = [e.text for e in events if isinstance(e, Text)]
    return "".join(texts), events[-1], texts


def test_a_cap_inside_a_word_drops_the_word():
    text, done, _ = read(WordCut(Stream(["The", " emoji", " of"], "length", max_tokens=3)))
    assert (text, done.reason, done.content) == ("The emoji ", "length", "The emoji ")
    assert done.usage.completion_tokens == 3  # the tokens generated, the dropped word's too


def test_an_end_of_turn_near_the_cap_sends_every_word():
    text, done, _ = read(WordCut(Stream(["The", " emoji", " of", " joy"], "stop", max_tokens=5, held="!")))
    assert (text, done.reason) == ("The emoji of joy!", "stop")


def test_far_from_the_cap_each_token_goes_as_it_comes():
    pieces = ["Once", " upon", " a", " time"]
    _, _, texts = read(WordCut(Stream(pieces, "stop", max_tokens=len(pieces) + HOLD_TOKENS)))
    assert texts == pieces


def test_near_the_cap_a_word_goes_once_it_has_ended():
    pieces = ["Once", " upon", " a", " time"]
    _, _, texts = read(WordCut(Stream(pieces, "stop", max_tokens=4)))
    assert texts == ["Once ", "upon ", "a ", "time"]  # "" for the first: held until " upon" ended it


def test_a_word_longer_than_the_hold_is_sent_as_far_as_it_came():
    pieces = ["see", " https://example.org/", *(["a"] * HOLD_TOKENS), "b"]
    text, done, _ = read(WordCut(Stream(pieces, "length", max_tokens=len(pieces))))
    assert text == "".join(pieces) and done.reason == "length"  # cutting its end would not mend it


def test_ideographs_and_whitespace_end_words_and_nothing_else():
    text, done, _ = read(WordCut(Stream(["你好", "世界", "。"], "length", max_tokens=3)))
    assert text == "你好世界。"
    assert all(is_break(c) for c in " \n\t你、") and not any(is_break(c) for c in "a'-.é1😀")
    assert last_break("one two thr") == len("one two ") and last_break("one") == 0


def test_a_length_the_request_named_is_cut_where_it_asked():
    stream = Stream(["The", " emoji", " of"], "length", max_tokens=3)
    assert between_words(stream, 3) is stream
    text, done, _ = read(stream)
    assert (text, done.reason) == ("The emoji of", "length")
    assert isinstance(between_words(stream, None), WordCut)


def test_no_limit_by_default_on_the_chat_lane_and_a_cap_where_set():
    assert chat.POLICY.max_tokens == 0
    asked = sampling.params(sampling.SamplingAsk(), chat.POLICY)
    assert asked.max_tokens == sampling.NO_LIMIT  # the engine ends it at its cache's room
    assert sampling.params(sampling.SamplingAsk(max_tokens=7), chat.POLICY).max_tokens == 7
    assert sampling.params(sampling.SamplingAsk(), voice.POLICY).max_tokens == voice.POLICY.max_tokens == 160
    assert sampling.params(sampling.SamplingAsk(), summaries.POLICY).max_tokens == 256


def test_a_prompt_with_no_answer_limit_still_leaves_room_for_an_answer():
    assert chat.prompt_limit(8192, sampling.NO_LIMIT) == 8192 - 2048
    assert chat.prompt_limit(8192, 100) == 8092
