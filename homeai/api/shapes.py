"""The answer stream in OpenAI's objects: chat completions and legacy completions, whole or as
stream chunks, with logprobs shaped as OpenAI shapes them.

A shape knows one response's id, model and creation time. `chunks(event)` turns one event of the
answer (`homeai.service.answer`) into the chunks it makes; `whole(whole)` is the non-streaming
object. A tool call (sent whole by the service) goes out as OpenAI streams one: its id and name,
then its arguments. The model's thoughts go out as llama-server and vLLM send them: a chat chunk's
`delta.reasoning_content`, and the message's `reasoning_content` (legacy completions, whose text
is the prompt continued, have none).
"""

from __future__ import annotations

import math
import time
import uuid

from homeai import __version__
from homeai.service.answer import Call, Done, Failed, Text, Thinking, Usage, Whole

FINGERPRINT = f"homeai-{__version__}"
FLOOR_LOGPROB = -9999.0  # what OpenAI sends for a probability that underflows


def usage(u: Usage) -> dict:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _lp(value: float | None) -> float:
    return FLOOR_LOGPROB if value is None or not math.isfinite(value) else value


class _Shape:
    prefix = ""
    object = ""
    chunk_object = ""

    def __init__(self, model: str, piece, *, logprobs: bool):
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.piece = piece  # token id -> bytes (service.piece)
        self.logprobs = logprobs
        self.num_calls = 0  # calls sent

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    def _text(self, token: int) -> tuple[str, bytes]:
        raw = self.piece(token)
        return raw.decode("utf-8", errors="replace"), raw

    def usage_chunk(self, u: Usage) -> dict:
        return {**self._head(self.chunk_object), "choices": [], "usage": usage(u)}

    def chunks(self, event) -> list[dict]:
        """The chunks one event of the answer makes; the last says why it finished ("abort" or
        "error" when it was cut short, or "tool_calls" once calls went out)."""
        if isinstance(event, Text):
            return [self.text_chunk(event.text, event.tokens)]
        if isinstance(event, Thinking):
            return self.thinking_chunks(event.text)
        if isinstance(event, Call):
            self.num_calls += 1
            return self.call_chunks(event)
        reason = event.reason if isinstance(event, Done) or not self.num_calls else "tool_calls"
        return [self.last_chunk(reason)]

    def call_chunks(self, event: Call) -> list[dict]:
        return []

    def thinking_chunks(self, text: str) -> list[dict]:
        return []


class ChatShape(_Shape):
    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def call_chunks(self, event: Call) -> list[dict]:
        """A call as OpenAI streams one: its id and name, then its arguments (whole)."""
        call, index = event.call, event.index
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        arguments = {"index": index, "function": {"arguments": call.arguments_json}}
        return [self.chunk({"tool_calls": [head]}, ()), self.chunk({"tool_calls": [arguments]}, ())]

    def thinking_chunks(self, text: str) -> list[dict]:
        return [self.chunk({"reasoning_content": text}, ())]

    def first_chunk(self) -> dict:
        return self.chunk({"role": "assistant", "content": ""}, ())

    def chunk(self, delta: dict, tokens, reason: str | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(tokens) if tokens else None,
                  "finish_reason": reason}
        return {**self._head(self.chunk_object), "choices": [choice]}

    def text_chunk(self, text: str, tokens) -> dict:
        return self.chunk({"content": text}, tokens)

    def last_chunk(self, reason: str) -> dict:
        return self.chunk({}, (), reason)

    def whole(self, w: Whole) -> dict:
        message = {"role": "assistant", "content": w.content, "refusal": None}
        if w.thinking:
            message["reasoning_content"] = w.thinking
        if w.calls:
            message["tool_calls"] = [call.as_openai() for call in w.calls]
        choice = {"index": 0, "message": message, "logprobs": self._logprobs(w.tokens), "finish_reason": w.reason}
        return {**self._head(self.object), "choices": [choice], "usage": usage(w.usage)}

    def _logprobs(self, tokens) -> dict | None:
        if not self.logprobs:
            return None
        return {"content": [self._entry(t) for t in tokens], "refusal": None}

    def _entry(self, token) -> dict:
        text, raw = self._text(token.token)
        top = []
        for other, logprob in token.top_logprobs:
            t, r = self._text(other)
            top.append({"token": t, "logprob": _lp(logprob), "bytes": list(r)})
        return {"token": text, "logprob": _lp(token.logprob), "bytes": list(raw), "top_logprobs": top}


class CompletionShape(_Shape):
    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    def __init__(self, model: str, piece, *, logprobs: bool):
        super().__init__(model, piece, logprobs=logprobs)
        self.offset = 0  # characters of completion text the tokens so far make

    def first_chunk(self) -> None:
        return None

    def text_chunk(self, text: str, tokens) -> dict:
        return self._chunk(text, tokens, None)

    def last_chunk(self, reason: str) -> dict:
        return self._chunk("", (), reason)

    def _chunk(self, text: str, tokens, reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": self._logprobs(tokens) if tokens else None,
                  "finish_reason": reason}
        return {**self._head(self.chunk_object), "choices": [choice]}

    def whole(self, w: Whole) -> dict:
        choice = {"index": 0, "text": w.content or "", "logprobs": self._logprobs(w.tokens), "finish_reason": w.reason}
        return {**self._head(self.object), "choices": [choice], "usage": usage(w.usage)}

    def _logprobs(self, tokens) -> dict | None:
        if not self.logprobs:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token in tokens:
            text, _ = self._text(token.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(_lp(token.logprob))
            out["top_logprobs"].append({self._text(t)[0]: _lp(lp) for t, lp in token.top_logprobs})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
