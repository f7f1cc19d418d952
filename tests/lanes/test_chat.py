"""The chat lane's prompt: history and documents fitted to a limit, without a model.

Run: .venv/bin/python -m pytest tests/lanes
"""

from __future__ import annotations

import pytest

from lanes import chat


def template(messages: list[dict]) -> str:
    """A stand-in chat template: one line per message, and the assistant's turn opened."""
    return "".join(f"<{m['role']}> {m['content']}\n" for m in messages) + "<assistant>"


def tokenize(text: str) -> list[int]:
    """A stand-in tokenizer: one token per word."""
    return [len(word) for word in text.split()]


def tokens(messages: list[dict]) -> list[int]:
    return tokenize(template(messages))


def build(history, limit, docs=""):
    return chat.build_prompt(history, docs, limit, template=template, tokenize=tokenize)


def turn(role: str, num_words: int, word: str = "w") -> dict:
    return {"role": role, "content": " ".join([word] * num_words)}


CONVERSATION = [turn("user", 5, "a"), turn("assistant", 5, "b"), turn("user", 5, "c"),
                turn("assistant", 5, "d"), turn("user", 5, "e")]


def test_a_conversation_that_fits_is_kept_whole():
    assert build(CONVERSATION, len(tokens(CONVERSATION))) == tokens(CONVERSATION)


def test_the_oldest_turns_are_dropped_first_and_as_few_as_possible():
    for keep in range(1, len(CONVERSATION)):
        limit = len(tokens(CONVERSATION[-keep:]))
        assert build(CONVERSATION, limit) == tokens(CONVERSATION[-keep:])
        assert build(CONVERSATION, limit + 5) == tokens(CONVERSATION[-keep:])  # the next older turn takes 6


def test_the_system_prompt_and_the_newest_question_are_kept():
    history = [turn("system", 4, "rules"), *CONVERSATION]
    kept = [history[0], *CONVERSATION[-1:]]
    assert build(history, len(tokens(kept))) == tokens(kept)
    assert build(history, len(tokens(kept)) + 5) == tokens(kept)  # one more turn needs 6


def test_documents_come_first_and_count_within_the_limit():
    docs = "[1] notes.md\nthe boiler code is 42"
    with_docs = [{"role": "system", "content": docs}, *CONVERSATION]
    assert build(CONVERSATION, 1000, docs) == tokens(with_docs)
    kept = [with_docs[0], *CONVERSATION[-2:]]
    assert build(CONVERSATION, len(tokens(kept)), docs) == tokens(kept)


def test_no_documents_add_no_system_message():
    assert build(CONVERSATION, None, "") == tokens(CONVERSATION)


def test_without_a_limit_every_message_is_kept():
    long = [turn("user", 5000), turn("assistant", 1), turn("user", 1)]
    assert build(long, None) == tokens(long)


def test_a_newest_message_too_long_alone_names_its_size_and_the_limit():
    history = [turn("user", 3), turn("assistant", 3), turn("user", 50)]
    with pytest.raises(chat.TooLong) as refused:
        build(history, 20)
    assert (refused.value.num_tokens, refused.value.limit) == (len(tokens(history[-1:])), 20)


def test_documents_too_long_with_the_question_are_refused():
    with pytest.raises(chat.TooLong) as refused:
        build([turn("user", 2)], 10, docs="word " * 40)
    assert refused.value.num_tokens > 40


def test_the_answer_keeps_room_of_at_most_a_quarter_of_the_sequence():
    assert chat.prompt_limit(4096, 512) == 4096 - 512
    assert chat.prompt_limit(4096, 4000) == 4096 - 1024


def test_documents_are_searched_for_the_newest_user_message():
    assert chat.question([turn("user", 1, "old"), turn("assistant", 1), turn("user", 1, "new")]) == "new"
    assert chat.question([turn("system", 1)]) == ""
