"""Engine events into OpenAI's response objects: chat completions and legacy completions,
whole or as stream chunks, with logprobs shaped as OpenAI shapes them.

A shape knows one response's id, model and creation time; `chunk` makes one streamed
piece from some text and the tokens behind it, `whole` the non-streaming object.
"""

from __future__ import annotations

import math
import time
import uuid

from homeai import __version__
from homeai.engine.engine import FinishEvent, TokenEvent
from homeai.tools import Reply, ToolPlan

FINGERPRINT = f"homeai-{__version__}"
FLOOR_LOGPROB = -9999.0  # what OpenAI sends for a probability that underflows


def usage(finish: FinishEvent) -> dict:
    s = finish.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.output_tokens,
            "total_tokens": s.prompt_tokens + s.output_tokens,
            "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}


def finish_reason(finish: FinishEvent, reply: Reply | None = None) -> str:
    """OpenAI's "stop", "length" or "tool_calls"; an answer cut short says "abort" (the server
    stopped) or "error"."""
    if reply is not None and reply.calls:
        return "tool_calls"
    return finish.reason if finish.reason in ("length", "abort", "error") else "stop"


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
        self.piece = piece  # token id -> bytes (runner.piece)
        self.logprobs = logprobs

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": FINGERPRINT}

    def _text(self, token: int) -> tuple[str, bytes]:
        raw = self.piece(token)
        return raw.decode("utf-8", errors="replace"), raw

    def usage_chunk(self, finish: FinishEvent) -> dict:
        return {**self._head(self.chunk_object), "choices": [], "usage": usage(finish)}

    def text_chunks(self, text: str, events: list[TokenEvent]) -> list[dict]:
        """The chunks a token's text makes (none when held back)."""
        return [self.text_chunk(text, events)]

    def end_chunks(self, finish: FinishEvent) -> list[dict]:
        """The chunks once the answer is whole: text held back, then the one with the finish reason."""
        return [*([self.text_chunk(finish.text, [])] if finish.text else []), self.last_chunk(finish)]


class ChatShape(_Shape):
    """With a tool plan, a reply's calls go out as `message.tool_calls` (or, streamed, as OpenAI's
    deltas, each call as soon as it is written whole), and text that may open a call is held back
    until decided."""

    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, model: str, piece, *, logprobs: bool, plan: ToolPlan | None = None):
        super().__init__(model, piece, logprobs=logprobs)
        self.calls = plan.stream() if plan is not None else None
        self.plan = plan
        self.num_sent = 0  # calls sent

    def text_chunks(self, text: str, events: list[TokenEvent]) -> list[dict]:
        if self.calls is None:
            return [self.text_chunk(text, events)]
        text = self.calls.feed(text)
        chunks = [self.text_chunk(text, events)] if text or (self.logprobs and events) else []
        return [*chunks, *self._call_chunks(self.calls.new_calls())]

    def end_chunks(self, finish: FinishEvent) -> list[dict]:
        if self.calls is None:
            return super().end_chunks(finish)
        self.calls.feed(finish.text)
        rest, reply = self.calls.finish()
        chunks = [self.text_chunk(rest, [])] if rest else []
        chunks += self._call_chunks(reply.calls[self.num_sent:])
        return [*chunks, self.chunk({}, [], finish_reason(finish, reply))]

    def _call_chunks(self, calls) -> list[dict]:
        """Each call as OpenAI streams one: its id and name, then its arguments (whole)."""
        chunks = []
        for index, call in enumerate(calls, start=self.num_sent):
            head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            arguments = {"index": index, "function": {"arguments": call.arguments_json}}
            chunks += [self.chunk({"tool_calls": [head]}, []), self.chunk({"tool_calls": [arguments]}, [])]
        self.num_sent += len(calls)
        return chunks

    def first_chunk(self) -> dict:
        return self.chunk({"role": "assistant", "content": ""}, [])

    def chunk(self, delta: dict, events: list[TokenEvent], reason: str | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": self._logprobs(events) if events else None,
                  "finish_reason": reason}
        return {**self._head(self.chunk_object), "choices": [choice]}

    def text_chunk(self, text: str, events: list[TokenEvent]) -> dict:
        return self.chunk({"content": text}, events)

    def last_chunk(self, finish: FinishEvent) -> dict:
        return self.chunk({}, [], finish_reason(finish))

    def whole(self, text: str, events: list[TokenEvent], finish: FinishEvent) -> dict:
        reply = self.plan.parse(text) if self.plan is not None else Reply(text)
        message = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.calls:
            message["tool_calls"] = [call.as_openai() for call in reply.calls]
        choice = {"index": 0, "message": message, "logprobs": self._logprobs(events),
                  "finish_reason": finish_reason(finish, reply)}
        return {**self._head(self.object), "choices": [choice], "usage": usage(finish)}

    def _logprobs(self, events: list[TokenEvent]) -> dict | None:
        if not self.logprobs:
            return None
        return {"content": [self._entry(e) for e in events], "refusal": None}

    def _entry(self, event: TokenEvent) -> dict:
        text, raw = self._text(event.token)
        top = []
        for token, logprob in event.top_logprobs:
            t, r = self._text(token)
            top.append({"token": t, "logprob": _lp(logprob), "bytes": list(r)})
        return {"token": text, "logprob": _lp(event.logprob), "bytes": list(raw), "top_logprobs": top}


class CompletionShape(_Shape):
    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    def __init__(self, model: str, piece, *, logprobs: bool):
        super().__init__(model, piece, logprobs=logprobs)
        self.offset = 0  # characters of completion text the tokens so far make

    def first_chunk(self) -> None:
        return None

    def text_chunk(self, text: str, events: list[TokenEvent]) -> dict:
        return self._chunk(text, events, None)

    def last_chunk(self, finish: FinishEvent) -> dict:
        return self._chunk("", [], finish_reason(finish))

    def _chunk(self, text: str, events: list[TokenEvent], reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": self._logprobs(events) if events else None,
                  "finish_reason": reason}
        return {**self._head(self.chunk_object), "choices": [choice]}

    def whole(self, text: str, events: list[TokenEvent], finish: FinishEvent) -> dict:
        choice = {"index": 0, "text": text, "logprobs": self._logprobs(events),
                  "finish_reason": finish_reason(finish)}
        return {**self._head(self.object), "choices": [choice], "usage": usage(finish)}

    def _logprobs(self, events: list[TokenEvent]) -> dict | None:
        if not self.logprobs:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for event in events:
            text, _ = self._text(event.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(_lp(event.logprob))
            out["top_logprobs"].append({self._text(t)[0]: _lp(lp) for t, lp in event.top_logprobs})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
