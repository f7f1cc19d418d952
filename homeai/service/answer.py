"""The answer stream: one generation as typed events, the same for every protocol.

    answer = await service.chat(ask, caller)
    async for event in answer:      # Thinking ... Text ... Call ... then exactly one Done or Failed
        ...
    whole = await answer.whole()    # or all of it at once (raises ServiceError when it failed)

`Thinking` is a piece of the model's thoughts (`homeai.service.thinking` splits them off first,
so they are never taken for tool calls, shown as content or spoken). `Text` is text safe to show
and the tokens behind it (for logprobs; a thought's tokens ride on `Text` too, with no text).
With tools, text that may open a call is held back until decided, and each call comes as one
`Call`, written whole, as soon as it is. `Done` ends an answer that finished ("stop", "length"
or "tool_calls"), with the whole reply parsed and its whole thoughts; `Failed` one cut short
("abort": the server stopping; "error": a failed step).
A reader that stops early calls `abort()` (idempotent); the engine frees the sequence within a step.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from homeai.engine.engine import FinishEvent, RequestStream, TokenEvent
from homeai.engine.stats import RequestStats
from homeai.service.errors import ServiceError, generation_failed, shutting_down
from homeai.service.thoughts import Splitter
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
class Thinking:
    text: str  # a piece of the model's thoughts: never content, never a call, never spoken


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
    thinking: str = ""  # the whole reply's thoughts, as sent in `Thinking` events


@dataclass(frozen=True)
class Failed:
    reason: str  # "abort" (the server is stopping) | "error" (a failed step)
    error: ServiceError


Event = Thinking | Text | Call | Done | Failed


@dataclass(frozen=True)
class Whole:
    content: str | None
    calls: tuple[ToolCall, ...]
    reason: str
    usage: Usage
    stats: RequestStats
    tokens: tuple[TokenEvent, ...]  # every token, for logprobs
    thinking: str = ""  # the model's thoughts ("" when it did not think)


class Answer:
    """One generation's events, read once. `model` and `lane` say who answers; `citations` are the
    household documents the answer was given (`documents`)."""

    def __init__(self, stream: RequestStream, *, model: str, lane: str, plan: ToolPlan | None = None,
                 with_tokens: bool = False, citations: list[dict] | None = None, thoughts: Splitter | None = None):
        self.stream = stream
        self.model, self.lane = model, lane
        self.plan = plan
        self.with_tokens = with_tokens  # a Text for every token, even one whose text is held back
        self.citations = citations or []
        self.calls = plan.stream() if plan is not None else None
        self.thoughts = thoughts  # splits thoughts from content, before the tool plan sees any text
        self.sent: list[ToolCall] = []
        self.text = ""  # every piece of the reply's content so far, calls included (no thoughts)
        self.thinking = ""  # every piece of its thoughts so far
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
        self.num_output_tokens += 1
        tokens = (event,) if self.with_tokens else ()
        out, content = self._split(event.text)
        self.text += content
        text = self.calls.feed(content) if self.calls is not None else content
        if text or tokens:
            out.append(Text(text, tokens))
        if self.calls is not None:
            out += self._sent(self.calls.new_calls())
        return out

    def _split(self, text: str, finish: bool = False) -> tuple[list[Event], str]:
        """A `Thinking` for the thoughts in `text` (and, `finish`ed, those held back), and its content."""
        if self.thoughts is None:
            return [], text
        thought, content = self.thoughts.feed(text)
        if finish:
            rest = self.thoughts.finish()
            thought, content = thought + rest[0], content + rest[1]
        self.thinking += thought
        return ([Thinking(thought)] if thought else []), content

    def _sent(self, calls) -> list[Call]:
        out = [Call(call, len(self.sent) + i) for i, call in enumerate(calls)]
        self.sent += calls
        return out

    def _end(self, finish: FinishEvent) -> list[Event]:
        """Thoughts and text held back, the calls not sent yet, then Done or Failed."""
        out, content = self._split(finish.text, finish=True)
        self.text += content
        if self.calls is None:
            out += [Text(content)] if content else []
        else:
            self.calls.feed(content)
            rest, reply = self.calls.finish()
            out += [Text(rest)] if rest else []
            out += self._sent(reply.calls[len(self.sent):])
        return [*out, self._last(finish)]

    def _last(self, finish: FinishEvent) -> Done | Failed:
        if finish.reason == "abort":
            return Failed("abort", shutting_down())
        if finish.reason == "error":
            return Failed("error", generation_failed(finish.error))
        reply = self._reply()
        reason = "tool_calls" if self.sent else ("length" if finish.reason == "length" else "stop")
        return Done(reason, reply.content, tuple(self.sent), Usage.of(finish.stats), finish.stats, self.thinking)

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
                    return Whole(event.content, event.calls, event.reason, event.usage, event.stats, tuple(tokens),
                                 event.thinking)
        except asyncio.CancelledError:
            self.abort()
            raise
        raise RuntimeError("an answer ended without Done or Failed")
