"""One request's tool calling, from prompt to parsed reply: what the template sees, the grammar the
sampler holds the reply to, and the calls found in the reply (each checked against its tool's schema).

A reply that holds no valid call is returned as text, never as an error: under `auto` the model
may answer in words, and a reply cut short (`length`) may hold half a call.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from homeai.config import GrammarConfig
from homeai.sched.request import Grammar
from homeai.tools import bounds
from homeai.tools.formats import CallFormat, RawCall, SchemaConverter
from homeai.tools.spec import ToolError, ToolSet, check_schema, dumps

DEFAULT_LIMITS = GrammarConfig()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    @property
    def arguments_json(self) -> str:
        return dumps(self.arguments)

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class Reply:
    content: str | None  # None: the reply was only calls
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class ToolPlan:
    tools: ToolSet
    format: CallFormat
    converter: SchemaConverter  # the tools' schemas to GBNF (the runner's: homeai.tools.formats.base)

    def grammar(self, limits: GrammarConfig = DEFAULT_LIMITS) -> Grammar:
        """Raises ToolError for tools past the `[grammar]` limits (`bounds`), a schema that is not valid
        or that the grammar converter cannot handle. The cheap checks come first: the number of tools
        and their size as JSON, before any schema is validated (each costs ~1 ms; 2,800 took seconds)."""
        offered = self.tools.tools
        if len(offered) > limits.max_enum:
            raise ToolError(f"{len(offered)} tools are offered; at most {limits.max_enum} are taken "
                            "(the [grammar] max_enum setting: each is an alternative the grammar weighs)", "tools")
        bounds.check_size([t.as_openai() for t in offered], "tools", limits)
        for i, tool in enumerate(offered):
            check_schema(tool.parameters, f"tools.{i}.function.parameters")
            bounds.check_schema(tool.parameters, f"tools.{i}.function.parameters", limits)
        grammar = self.format.grammar(self.tools, self.converter)
        bounds.check_gbnf(grammar.text, "tools", limits)
        return grammar

    @property
    def stops(self) -> tuple[str, ...]:
        """Text that ends the reply in this format (FunctionGemma's `<end_function_call>`: the tool's
        answer would come next), for the request's stop strings."""
        return self.format.stops

    def template_tools(self) -> list[dict] | None:
        """The `tools` for the chat template: none for a template that knows no tools (the system
        prompt describes them instead)."""
        return [t.as_openai() for t in self.tools.offered()] if self.format.tools_in_template else None

    def messages(self, messages: list[dict]) -> list[dict]:
        """The conversation for the template. A template that knows no tools gets them in the system
        prompt, earlier calls as the JSON the model writes, and tool results as user turns."""
        return self.format.messages(messages, self.tools)

    def parse(self, text: str) -> Reply:
        """The reply's calls and the text around them; a reply cut short (the length limit) in a
        later call keeps the calls written whole before it, as a stream has sent them."""
        found = self.format.find_calls(text)
        calls = self._valid(found[1]) if found else None
        if calls:
            return Reply(found[0] or None, tuple(calls))
        opens = self.format.opens_at(text)
        whole = self.whole_calls(text) if opens is not None else []
        return Reply(text[:opens].strip() or None, tuple(whole)) if whole else Reply(text)

    def whole_calls(self, text: str) -> list[ToolCall]:
        """The calls written whole so far, each valid for its tool, up to the first that is not."""
        calls = []
        for raw in self.format.whole_calls(text)[:None if self.tools.parallel else 1]:
            call = self._checked(raw)
            if call is None:
                break
            calls.append(call)
        return calls

    def _checked(self, raw: RawCall) -> ToolCall | None:
        """The call, if it names an offered tool with arguments that fit its schema (typed by the
        format first: XML's values are text); the model's own id kept, if it wrote one."""
        tool = self.tools.find(raw.name)
        if tool is None:
            return None
        arguments = self.format.arguments_for(tool, raw.arguments)
        if tool.check_arguments(arguments) is not None:
            return None
        return ToolCall(raw.name, arguments, raw.id or self.format.new_id())

    def _valid(self, raw: list) -> list[ToolCall] | None:
        """The calls, if every one names an offered tool with arguments that fit its schema."""
        if not raw or (len(raw) > 1 and not self.tools.parallel):
            return None
        calls = [self._checked(call) for call in raw]
        return None if None in calls else calls

    def stream(self) -> "CallStream":
        return CallStream(self)


class CallStream:
    """Streams a reply's text while holding back what may be the start of a call, and each call as
    soon as it is written whole (as Ollama streams them); at the end, the reply parsed. Text before
    a call is sent as it comes; from a call's opening on no text is sent until the reply is whole
    (then, if no call came, the held text: a reply that only looked like a call)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.sent = 0  # characters of `text` sent as content
        self.in_call = False
        self.calls: list[ToolCall] = []  # the calls sent so far

    def feed(self, delta: str) -> str:
        """The content that can be sent now."""
        self.text += delta
        if self.in_call:
            return ""
        fmt = self.plan.format
        opens = fmt.opens_at(self.text, self.sent)
        if opens is not None:
            self.in_call = True
            return self._send_to(opens)
        may = fmt.may_open_at(self.text, self.sent)
        return self._send_to(may if may is not None else len(self.text))

    def new_calls(self) -> list[ToolCall]:
        """The calls written whole since the last time, each valid for its tool (they are then sent:
        the reply is a call). A call that is not valid stops this; the end decides then."""
        if not self.in_call:
            return []
        new = self.plan.whole_calls(self.text)[len(self.calls):]
        self.calls += new
        return new

    def _send_to(self, end: int) -> str:
        end = max(end, self.sent)
        out = self.text[self.sent:end]
        self.sent = end
        return out

    def finish(self) -> tuple[str, Reply]:
        """The content still to send and the whole reply (its calls include those already sent:
        `calls` says which). A reply with calls written whole is its calls: a last one cut short
        (the length limit) or not valid is dropped, not sent as text."""
        self.new_calls()
        if self.calls:
            return "", Reply(None, tuple(self.calls))
        reply = self.plan.parse(self.text)
        if reply.calls:
            return "", reply
        return self._send_to(len(self.text)), reply
