"""The voice lane: spoken questions after speech-to-text; end of speech to first token is what counts."""

from lanes.base import INTERACTIVE, LanePolicy

POLICY = LanePolicy(
    name="voice", lane_class=INTERACTIVE, priority=0, weight=4.0, window_ms=2.0, max_batch=8,
    max_queue=32, ttft_target_ms=800.0, itl_target_ms=80.0, max_tokens=160,
)

# Answers are read aloud: short sentences, nothing a speech synthesiser would stumble on.
SYSTEM_PROMPT = (
    "You are a helpful voice assistant for a household. Answer in one to three short spoken "
    "sentences. Do not use markdown, lists, code, emoji or URLs."
)


def build_messages(transcript: str, history: list[dict] | None = None) -> list[dict]:
    """The chat messages for a spoken question, with the spoken-style system prompt first."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, *(history or []),
            {"role": "user", "content": transcript.strip()}]
