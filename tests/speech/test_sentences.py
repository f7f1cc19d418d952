"""Sentences cut from text as it arrives, and speakable text: pure, no speech library.

Run: .venv/bin/python -m pytest tests/speech/test_sentences.py
"""

from __future__ import annotations

import pytest

from homeai.speech.sentences import HARD_MAX, SOFT_MAX, Sentences, speakable


def cut(text: str, step: int | None = None) -> list[str]:
    """The sentences of `text` fed `step` characters at a time (None: whole)."""
    cutter = Sentences()
    step = step or len(text) or 1
    out = []
    for i in range(0, len(text), step):
        out += cutter.feed(text[i:i + step])
    return out + cutter.flush()


def same_whatever_the_pieces(text: str) -> list[str]:
    """The sentences, checked to be the same fed whole, a character at a time, and in odd pieces."""
    whole = cut(text)
    for step in (1, 2, 3, 7, 13):
        assert cut(text, step) == whole, step
    return whole


# ---- where sentences end -------------------------------------------------------------------

@pytest.mark.parametrize("text, sentences", [
    ("Hello there. How are you? Fine!", ["Hello there.", "How are you?", "Fine!"]),
    ("It costs 3.5 dollars. Then 10.25 more.", ["It costs 3.5 dollars.", "Then 10.25 more."]),
    ("Use salt, e.g. sea salt. Or not.", ["Use salt, e.g. sea salt.", "Or not."]),
    ("That is, i.e. the first. Done.", ["That is, i.e. the first.", "Done."]),
    ("Dr. Smith met Mr. Jones and Mrs. Brown. They talked.", ["Dr. Smith met Mr. Jones and Mrs. Brown.",
                                                              "They talked."]),
    ("She lives in the U.S. and works in the U.K. office.", ["She lives in the U.S. and works in the U.K. office."]),
    ("J. R. R. Tolkien wrote it. Read it.", ["J. R. R. Tolkien wrote it.", "Read it."]),
    ("Bring pens, paper, etc. Then sit.", ["Bring pens, paper, etc.", "Then sit."]),
    ("Bring pens, paper, etc. and sit.", ["Bring pens, paper, etc. and sit."]),
    ("We meet at 5 p.m. Be there.", ["We meet at 5 p.m.", "Be there."]),
    ("It weighs approx. five kilos.", ["It weighs approx. five kilos."]),
    ("Wait... What happened?", ["Wait...", "What happened?"]),
    ("Really?! Yes.", ["Really?!", "Yes."]),
    ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
    ("(It was late.) We slept.", ["(It was late.)", "We slept."]),
    ("Version 2.0.1 is out. Update now.", ["Version 2.0.1 is out.", "Update now."]),
    ("Call 555.1234 today. Thanks.", ["Call 555.1234 today.", "Thanks."]),
    ("No stop at the end", ["No stop at the end"]),
])
def test_sentence_ends(text, sentences):
    assert same_whatever_the_pieces(text) == sentences


def test_a_blank_line_and_a_line_end_each_end_one():
    text = "First paragraph without a stop\n\nSecond one\nThird line."
    assert same_whatever_the_pieces(text) == ["First paragraph without a stop", "Second one", "Third line."]


def test_each_list_item_is_a_sentence_without_its_marker():
    text = "Steps:\n1. Preheat the oven\n2. Mix 2.5 cups of flour\n10. Bake\n- eggs\n* milk\n+ butter\n"
    assert same_whatever_the_pieces(text) == ["Steps:", "Preheat the oven", "Mix 2.5 cups of flour", "Bake",
                                              "eggs", "milk", "butter"]


def test_an_item_number_mid_line_is_a_number():
    assert same_whatever_the_pieces("I have 2. Or 3.") == ["I have 2.", "Or 3."]


def test_a_sentence_is_given_as_soon_as_the_next_word_begins():
    cutter = Sentences()
    assert cutter.feed("The answer is 3") == []
    assert cutter.feed(".") == []  # "3." might be "3.5"
    assert cutter.feed("5") == []
    assert cutter.feed(". ") == []  # the next word might be lower case ("approx. five")
    assert cutter.feed("Next") == ["The answer is 3.5."]
    assert cutter.feed(" one!") == []
    assert cutter.feed("\n") == ["Next one!"]
    assert cutter.flush() == []


def test_a_question_needs_only_the_space_after_it():
    cutter = Sentences()
    assert cutter.feed("Ready?") == []
    assert cutter.feed(" ") == ["Ready?"]


def test_a_long_sentence_is_cut_at_a_comma_past_the_soft_limit():
    clause = "and then we walked a little further along the river"
    text = ", ".join([clause] * 8) + "."
    sentences = same_whatever_the_pieces(text)
    assert len(sentences) >= 2
    assert all(len(s) <= SOFT_MAX + len(clause) + 2 for s in sentences)
    assert " ".join(sentences) == text


def test_a_sentence_without_commas_is_cut_at_a_space_past_the_hard_limit():
    text = " ".join(["word"] * 200) + "."
    sentences = same_whatever_the_pieces(text)
    assert len(sentences) >= 2 and all(len(s) <= HARD_MAX for s in sentences)
    assert " ".join(sentences) == text


def test_empty_and_markup_only_text_gives_nothing():
    assert cut("") == []
    assert cut("   \n\n  ") == []
    assert cut("---\n***\n|---|---|\n") == []
    assert cut("**") == []


def test_flush_resets_for_the_next_text():
    cutter = Sentences()
    assert cutter.feed("```\ncode") == []
    assert cutter.flush() == []
    assert cutter.feed("Plain text.\n") == ["Plain text."]


# ---- no markup spoken ----------------------------------------------------------------------

@pytest.mark.parametrize("text, said", [
    ("This is **bold** and __strong__.", "This is bold and strong."),
    ("This is *emphasis* and _this too_.", "This is emphasis and this too."),
    ("Keep snake_case_names and 2*3 as they are.", "Keep snake_case_names and 23 as they are."),
    ("Run `make test` now.", "Run make test now."),
    ("Read [the guide](https://example.com/guide) first.", "Read the guide first."),
    ("See ![a cat](cat.png) here.", "See a cat here."),
    ("Go to https://www.python.org/downloads/release now.", "Go to python.org now."),
    ("Or <https://example.org/x?y=1>.", "Or example.org."),
    ("~~Old~~ New price.", "Old New price."),
    ("A <b>bold</b> tag<br/>.", "A bold tag."),
    ("Footnote here[^1].", "Footnote here."),
    ("Escaped \\*stars\\*.", "Escaped stars."),
])
def test_inline_markup_is_not_spoken(text, said):
    assert same_whatever_the_pieces(text) == [said]
    assert speakable(text) == said


def test_markdown_blocks():
    text = ("# Shopping list\n\n"
            "## For *Sunday*\n"
            "> Remember: buy **fresh** bread.\n"
            "- [ ] eggs\n"
            "- [x] milk\n\n"
            "| Item | Price |\n"
            "|:-----|------:|\n"
            "| Bread | 2.50 |\n\n"
            "---\n"
            "That is all.")
    assert same_whatever_the_pieces(text) == [
        "Shopping list", "For Sunday", "Remember: buy fresh bread.", "eggs", "milk",
        "Item, Price", "Bread, 2.50", "That is all."]


def test_code_blocks_are_left_out():
    text = "Try this:\n```python\nprint('hello. world')\nx = 1\n```\nIt prints hello.\n~~~\nraw\n~~~\nDone."
    assert same_whatever_the_pieces(text) == ["Try this:", "It prints hello.", "Done."]
    assert speakable(text) == "Try this: It prints hello. Done."


def test_speakable_joins_lines_as_sentences():
    assert speakable("# Title\n- one\n- two") == "Title. one. two."
    assert speakable("  many    spaces\there ") == "many spaces here"
    assert speakable("") == ""
    assert speakable("```\nonly code\n```") == ""


def test_a_token_stream_like_a_models():
    tokens = ["Sure", "!", " Here", " are", " the", " steps", ":\n", "1", ".", " Open", " the", " **",
              "app", "**", ".\n", "2", ".", " Tap", " *", "Settings", "*", ".\n\n", "That", "'s", " it", "."]
    cutter = Sentences()
    seen = []
    for token in tokens:
        seen += cutter.feed(token)
    seen += cutter.flush()
    assert seen == ["Sure!", "Here are the steps:", "Open the app.", "Tap Settings.", "That's it."]


def test_a_first_clause_is_spoken_before_its_sentence_ends():
    cutter = Sentences(first_clause=24)
    said = []
    for piece in "In Tokyo, it is about 9:15 in the morning, which is 2:15 in Berlin. It is sunny, warm and dry.":
        said += cutter.feed(piece)
    said += cutter.flush()
    assert said == ["In Tokyo, it is about 9:15 in the morning,", "which is 2:15 in Berlin.",
                    "It is sunny, warm and dry."]


def test_a_short_first_clause_waits_and_numbers_are_not_clauses():
    cutter = Sentences(first_clause=24)
    assert cutter.feed("Yes, the oven is on. ") == []  # "Yes," is too short to say alone; the sentence waits
    assert cutter.feed("Next") == ["Yes, the oven is on."]
    cutter = Sentences(first_clause=24)
    assert cutter.feed("The house used 1,250 kWh in total last") == []  # "1,250": no space after the comma
    assert Sentences().feed("In Tokyo, it is about 9:15 in the morning, which") == []  # off by default
