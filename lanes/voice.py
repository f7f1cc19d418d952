"""The voice lane: spoken questions after speech-to-text; end of speech to first token is what counts.

Besides its policy, the lane owns what a spoken question is answered from: a system prompt asking
for short spoken sentences, and the last few messages of the conversation named, if any.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lanes.base import INTERACTIVE, LanePolicy, ServerText

Prompt = TypeVar("Prompt")  # what the model's chat template makes of messages (the engine's `ChatPrompt`)

POLICY = LanePolicy(
    name="voice", lane_class=INTERACTIVE, priority=0, weight=4.0, window_ms=2.0, max_batch=8,
    max_queue=32, ttft_target_ms=800.0, itl_target_ms=80.0, max_tokens=160,
)

# Answers are read aloud: short sentences, nothing a speech synthesiser would stumble on. The server
# wrote it, not a member: it leads the prompt's public prefix (shared from the prompt cache).
SYSTEM_PROMPT = ServerText(
    "You are a helpful voice assistant for a household. Answer in one to three short spoken "
    "sentences. Do not use markdown, lists, code, emoji or URLs."
)
MAX_HISTORY = 10  # messages of the conversation put in front of the question: enough context, a quick prefill


def recent_history(messages: list[dict]) -> list[dict]:
    """The turns a spoken question is answered after: of the conversation's last `MAX_HISTORY`
    messages, those of the user and the assistant with something said."""
    return [{"role": m["role"], "content": m["content"]} for m in messages[-MAX_HISTORY:]
            if m["role"] in ("user", "assistant") and m["content"]]


def build_messages(transcript: str, history: list[dict] | None = None) -> list[dict]:
    """The chat messages for a spoken question, with the spoken-style system prompt first."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, *(history or []),
            {"role": "user", "content": transcript.strip()}]


def build_prompt(transcript: str, history: list[dict], *,
                 template: Callable[[list[dict]], Prompt]) -> Prompt:
    """The prompt for a spoken question, rendered with the model's chat `template`."""
    return template(build_messages(transcript, history))
