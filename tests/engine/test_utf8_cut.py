"""A reply cut by a limit ends on a whole character: the part of one a cut leaves is dropped, never U+FFFD."""

from __future__ import annotations

from homeai.engine.engine import TokenEvent
from homeai.engine.text import TextStream
from homeai.sched.request import SamplingParams

# SmolLM2 answers this in Japanese under temperature 0; its byte-level vocabulary splits most of
# those characters across two tokens, so many cuts fall inside a character.
QUESTION = "Write 'hello' in Japanese."
NUM_TOKENS = 16


def test_a_character_cut_short_is_dropped_and_bad_bytes_stay_visible():
    stream = TextStream()
    assert stream.add("こ".encode()[:2]) == ("", False)
    assert stream.flush() == ""
    stream = TextStream()
    assert stream.add(b"ok \xff") == ("ok \ufffd", False)  # not a character's start: shown as such
    assert stream.add("é".encode()[:1]) == ("", False)
    assert stream.flush() == ""


def test_a_stop_string_after_half_a_character_leaves_nothing_behind():
    stream = TextStream(stop=("END",))
    assert stream.add(b"hi END\xe3\x81") == ("hi ", True)
    assert stream.flush() == ""


def test_every_cut_of_a_multibyte_answer_ends_on_a_whole_character(runner, make_engine):
    engine = make_engine()
    prompt = runner.apply_chat_template([{"role": "user", "content": QUESTION}])
    full = engine.submit(prompt, params=SamplingParams(temperature=0, max_tokens=NUM_TOKENS))
    full_text = "".join(e.text for e in full)
    tokens = full.request.output_tokens
    mid_character = [n for n in range(1, len(tokens) + 1) if not _decodes(runner, tokens[:n])]
    assert len(mid_character) >= 3, "the answer should have cuts inside a character to test"
    for n in range(1, len(tokens) + 1):
        stream = engine.submit(prompt, params=SamplingParams(temperature=0, max_tokens=n))
        events = list(stream)
        text = "".join(e.text for e in events)
        assert stream.finished.reason == "length"
        assert len([e for e in events if isinstance(e, TokenEvent)]) == n
        assert "\ufffd" not in text and full_text.startswith(text), (n, text)
        whole = b"".join(runner.piece(t) for t in tokens[:n]).decode("utf-8", errors="ignore")
        assert text == whole  # only the cut character is missing, nothing before it


def _decodes(runner, tokens: list[int]) -> bool:
    try:
        b"".join(runner.piece(t) for t in tokens).decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
