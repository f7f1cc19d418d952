"""The voice lane's prompt: the spoken-style system prompt and the conversation's recent turns.

Run: .venv/bin/python -m pytest tests/lanes
"""

from __future__ import annotations

from lanes import voice


def test_the_system_prompt_goes_first_and_the_question_last():
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    messages = voice.build_messages("  what time is it?\n", history)
    assert messages[0] == {"role": "system", "content": voice.SYSTEM_PROMPT}
    assert messages[1:3] == history
    assert messages[-1] == {"role": "user", "content": "what time is it?"}


def test_the_prompt_is_the_messages_through_the_template():
    rendered = voice.build_prompt("hello", [], template=lambda ms: "|".join(m["role"] for m in ms))
    assert rendered == "system|user"


def test_history_is_the_last_messages_said_by_the_user_and_the_assistant():
    said = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(14)]
    assert voice.recent_history(said) == said[-voice.MAX_HISTORY:]
    mixed = [*said[:8], {"role": "system", "content": "s"}, {"role": "assistant", "content": ""}]
    assert voice.recent_history(mixed) == said[:8][-(voice.MAX_HISTORY - 2):]
