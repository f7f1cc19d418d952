"""The chat lane: the household web chat and OpenAI clients; TTFT and a steady reading pace count.

Besides its policy, the lane owns how a chat request becomes a prompt: the household's documents
go first as a system message, and a conversation longer than the context loses its oldest turns
first; system messages and the newest message always stay. It is pure: the routes pass the
model's chat template and tokenizer in, so the fitting is tested without a model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lanes.base import INTERACTIVE, LanePolicy

POLICY = LanePolicy(
    name="chat", lane_class=INTERACTIVE, priority=1, weight=2.0, window_ms=5.0, max_batch=16,
    max_queue=64, ttft_target_ms=1500.0, itl_target_ms=100.0, max_tokens=0,
)  # no cap: an answer people read runs to its end of turn (a household may set one: `[lanes.chat] max_tokens`)

MAX_DOCUMENTS = 5  # chunks of the household's documents put before a question that asks for them

Prompt = TypeVar("Prompt")  # the model's prompt, in parts by writer (the engine's `ChatPrompt`): only passed on here
Template = Callable[[list[dict]], Prompt]  # chat messages -> the model's prompt
Tokenize = Callable[[Prompt], list[int]]  # the runner's: `PromptTokens`, with the public prefix


class TooLong(ValueError):
    """Even the shortest prompt kept (system messages, documents, the newest message) is over the limit."""

    def __init__(self, num_tokens: int, limit: int):
        super().__init__(f"the prompt has {num_tokens} tokens but at most {limit} fit")
        self.num_tokens, self.limit = num_tokens, limit


def question(messages: list[dict]) -> str:
    """What the documents are searched for: the newest user message ("" when there is none)."""
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


def prompt_limit(max_seq_len: int, max_tokens: int) -> int:
    """The prompt's share of a sequence: room is left for the answer, at most a quarter of it,
    so that a long conversation still gets most of the context (an answer with no cap, a huge
    `max_tokens`, gets that quarter)."""
    return max_seq_len - min(max_tokens, max_seq_len // 4)


def build_prompt(history: list[dict], docs: str, limit: int | None, *, template: Template[Prompt],
                 tokenize: Tokenize[Prompt]) -> list[int]:
    """The prompt's tokens: `docs` (a system message's text, "" for none) before `history`.

    With a `limit`, the oldest turns are dropped until it fits (raises `TooLong` when even the
    newest alone does not). With none, every message is kept: an API client chose them, and a
    prompt too long for the model is the engine's refusal to report.
    """
    messages = [{"role": "system", "content": docs}, *history] if docs else list(history)

    def tokens_from(start: int) -> list[int]:
        return tokenize(template([*pinned, *turns[start:]]))

    num_pinned = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    pinned, turns = messages[:num_pinned], messages[num_pinned:]
    tokens = tokens_from(0)
    if limit is None or len(tokens) <= limit:
        return tokens
    if not turns:
        raise TooLong(len(tokens), limit)
    low, high, best = 1, len(turns) - 1, None  # fewer turns never take more tokens: bisect
    while low <= high:
        mid = (low + high) // 2
        candidate = tokens_from(mid)
        if len(candidate) <= limit:
            best, high = candidate, mid - 1
        else:
            low = mid + 1
    if best is None:
        raise TooLong(len(tokens_from(len(turns) - 1)), limit)
    return best
