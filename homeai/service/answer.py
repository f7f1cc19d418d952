"""The answer stream: one generation as typed events, the same for every protocol.

    answer = await service.chat(ask, caller)
    async for event in answer:      # Text ... Call ... then exactly one Done or Failed
        ...
    whole = await answer.whole()    # or all of it at once (raises ServiceError when it failed)

`Text` is text safe to show and the tokens behind it (for logprobs). With tools, text that may
open a call is held back until decided, and each call comes as one `Call`, written whole, as
soon as it is. `Done` ends an answer that finished ("stop", "length" or "tool_calls"), with the
whole reply parsed; `Failed` one cut short ("abort": the server stopping; "error": a failed step).
A reader that stops early calls `abort()` (idempotent); the engine frees the sequence within a step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from homeai.engine.engine import FinishEvent, RequestStream, TokenEvent
from homeai.engine.stats import RequestStats
from homeai.service.errors import ServiceError, generation_failed, shutting_down
from homeai.tools import Reply, ToolCall, ToolPlan


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens found in the prompt cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, stats: RequestStats) -> "Usage":
        return cls(stats.prompt_tokens, stats.output_tokens, stats.cached_tokens)


@dataclass(frozen=True)
class Text:
    text: str  # may be "" when only tokens are carried (logprobs asked for, text held back)
    tokens: tuple[TokenEvent, ...] = ()


@dataclass(frozen=True)
class Call:
    call: ToolCall
    index: int  # 0, 1, ...: the call's place in the reply


@dataclass(frozen=True)
class Done:
    reason: str  # "stop" | "length" | "tool_calls"
    content: str | None  # the whole reply's text without its calls; None when it was only calls
    calls: tuple[ToolCall, ...]  # every call, as sent in `Call` events
    usage: Usage
    stats: RequestStats


@dataclass(frozen=True)
class Failed:
    reason: str  # "abort" (the server is stopping) | "error" (a failed step)
    error: ServiceError


Event = Text | Call | Done | Failed


@dataclass(frozen=True)
class Whole:
    content: str | None
    calls: tuple[ToolCall, ...]
    reason: str
    usage: Usage
    stats: RequestStats
    tokens: tuple[TokenEvent, ...]  # every token, for logprobs


class Answer:
    """One generation's events, read once. `model` and `lane` say who answers; `citations` are the
    household documents the answer was given (`documents`)."""

    def __init__(self, stream: RequestStream, *, model: str, lane: str, plan: ToolPlan | None = None,
                 with_tokens: bool = False, citations: list[dict] | None = None):
        self.stream = stream
        self.model, self.lane = model, lane
        self.plan = plan
        self.with_tokens = with_tokens  # a Text for every token, even one whose text is held back
        self.citations = citations or []
        self.calls = plan.stream() if plan is not None else None
        self.sent: list[ToolCall] = []
        self.text = ""  # every piece of the reply so far, calls included
        self.num_output_tokens = 0  # tokens read so far (an answer cut short has some too)
        self.read = False

    @property
    def request_id(self) -> str:
        return self.stream.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return self.stream.request.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.stream.finished is not None

    def abort(self) -> None:
        """Stop generating; the stream then ends with Failed("abort"). Nothing once finished."""
        if self.stream.finished is None:
            self.stream.abort()

    def __aiter__(self):
        if self.read:
            raise RuntimeError("an answer is read once")
        self.read = True
        return self._events()

    async def _events(self):
        try:
            async for event in self.stream:
                if isinstance(event, TokenEvent):
                    for out in self._token(event):
                        yield out
            for out in self._end(self.stream.finished):
                yield out
        finally:
            self.abort()

    def _token(self, event: TokenEvent) -> list[Event]:
        self.text += event.text
        self.num_output_tokens += 1
        tokens = (event,) if self.with_tokens else ()
        text = self.calls.feed(event.text) if self.calls is not None else event.text
        out: list[Event] = [Text(text, tokens)] if text or tokens else []
        if self.calls is not None:
            out += self._sent(self.calls.new_calls())
        return out

    def _sent(self, calls) -> list[Call]:
        out = [Call(call, len(self.sent) + i) for i, call in enumerate(calls)]
        self.sent += calls
        return out

    def _end(self, finish: FinishEvent) -> list[Event]:
        """Text held back, the calls not sent yet, then Done or Failed."""
        self.text += finish.text
        if self.calls is None:
            out: list[Event] = [Text(finish.text)] if finish.text else []
        else:
            self.calls.feed(finish.text)
            rest, reply = self.calls.finish()
            out = [Text(rest)] if rest else []
            out += self._sent(reply.calls[len(self.sent):])
        return [*out, self._last(finish)]

    def _last(self, finish: FinishEvent) -> Done | Failed:
        if finish.reason == "abort":
            return Failed("abort", shutting_down())
        if finish.reason == "error":
            return Failed("error", generation_failed(finish.error))
        reply = self._reply()
        reason = "tool_calls" if self.sent else ("length" if finish.reason == "length" else "stop")
        return Done(reason, reply.content, tuple(self.sent), Usage.of(finish.stats), finish.stats)

    def _reply(self) -> Reply:
        """The whole reply's text without its calls (parsed once the reply is whole)."""
        if self.plan is None or not self.sent:
            return Reply(self.text)
        return Reply(self.plan.parse(self.text).content)

    async def whole(self) -> Whole:
        """The whole answer; raises its ServiceError when it failed. Cancelled, it aborts."""
        tokens: list[TokenEvent] = []
        self.with_tokens = True
        try:
            async for event in self:
                if isinstance(event, Text):
                    tokens += event.tokens
                elif isinstance(event, Failed):
                    raise event.error
                elif isinstance(event, Done):
                    return Whole(event.content, event.calls, event.reason, event.usage, event.stats, tuple(tokens))
        except asyncio.CancelledError:
            self.abort()
            raise
        raise RuntimeError("an answer ended without Done or Failed")
