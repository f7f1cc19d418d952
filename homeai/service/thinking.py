"""Thinking: how a model thinks, read from its chat template, what a request asks of it, and the
reply's thoughts split from its answer as it streams.

    form = thinking.form_of(runner.chat.template)    # once per template: Form
    ask = ThinkAsk(on=False)                           # the request's `think`, `reasoning_effort`, ...
    extra = thinking.variables(form, ask)              # the template variables that ask it
    prompt = thinking.closed(prompt, form, ask)        # a `<think>` the prompt opened, shut when off
    opened = thinking.opens_thought(prompt, form)      # the prompt left a thought open
    split = thinking.splitter(form, opened=opened)     # then the reply starts in it
    thought, content = split.feed(piece)               # ... then split.finish()

The forms (`Form.kind`), from the template's source:

    harmony   gpt-oss (`<|channel|>`): always thinks, in the analysis channel; `reasoning_effort`
              low/medium/high goes to the template. It cannot be switched off: its thoughts are
              still split off, never shown as content.
    switch    a template variable turns it on and off: `enable_thinking` (Qwen3, SmolLM3), `thinking`
              (Granite 3.x, whose answer comes in `<response>` tags, taken off); `<think>` tags.
    opened    the generation prompt opens `<think>` (DeepSeek-R1 distills): off closes it at once,
              the prompt then ending `<think>\\n\\n</think>\\n\\n` as Qwen3's own does when off.
    tags      the model writes `<think>` or Magistral's `[THINK]` itself; no switch in the template.
    none      the model cannot think.

Thoughts are recognised only where a reply starts (after white space), as llama.cpp reads them:
a reply that later mentions `<think>` is not thinking. Harmony's reply is a run of messages:
`analysis` goes to thoughts, `final` (and a `commentary` preamble without a recipient) to content,
headers taken off; a `commentary` message that calls a function (`to=functions.NAME`) goes to
content verbatim, header, arguments and its `<|end|>` if written, for the tool parser
(`homeai.tools.formats`). Pieces may be split anywhere, inside a tag too: the same text gives the
same thoughts and content however it is split.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from homeai.engine.prompt import ChatPrompt, Part, Source
from homeai.engine.template import ChatTemplate
from homeai.service.asks import ThinkAsk
from homeai.service.thoughts import HarmonySplitter, Splitter, TagSplitter

# Template variables a request's `chat_template_kwargs` may not set: the template's own inputs and globals.
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
                      "strftime_now"})

_HARMONY = "<|channel|>"
_GRANITE_SWITCH = re.compile(r"\b(?:if|elif|and|or|not)\s+thinking\b")
# A message's earlier thoughts as a template reads them: `message.thinking`, `message['thinking']`,
# `"thinking" in message`
_FIELD = r"(?:\.{0}\b|\[\s*['\"]{0}['\"]\s*\]|['\"]{0}['\"]\s+in\s+\w+)"
_READS_THINKING = re.compile(_FIELD.format("thinking"))
_READS_REASONING = re.compile(_FIELD.format("reasoning_content"))


@dataclass(frozen=True)
class Form:
    kind: str  # "harmony" | "switch" | "opened" | "tags" | "none"
    switch: str | None = None  # the template variable that turns it on and off ("enable_thinking", "thinking")
    open: str = "<think>"
    close: str = "</think>"
    answer_tags: tuple[str, ...] = ()  # tags around the answer, taken off it (Granite's `<response>`)
    history: str | None = None  # the message field the template reads earlier thoughts from

    @property
    def can_think(self) -> bool:
        return self.kind != "none"

    @property
    def can_stop(self) -> bool:
        """Whether `think: false` stops it thinking (harmony and `tags` think whatever is asked)."""
        return self.kind in ("switch", "opened")

    def describe(self) -> str:
        """One line for `/api/show`: how this model thinks and how a request switches it."""
        return {
            "harmony": "gpt-oss harmony: always thinks (analysis channel); reasoning_effort low/medium/high",
            "switch": f"thinks when asked: the template's {self.switch!r} variable, thoughts in {self.open} tags",
            "opened": f"the prompt opens {self.open}: thinks unless asked not to (then the prompt closes it)",
            "tags": f"may think in {self.open} tags on its own; no switch in the template",
            "none": "cannot think",
        }[self.kind]


NONE = Form("none")


@functools.lru_cache(maxsize=8)
def form_of(template: ChatTemplate | None) -> Form:
    """How the model with this chat template (None: none) thinks, from its source and its
    generation prompt; once per template."""
    if template is None:
        return NONE
    source = template.source
    history = "thinking" if _READS_THINKING.search(source) else (
        "reasoning_content" if _READS_REASONING.search(source) else None)
    if _HARMONY in source:
        return Form("harmony", history=history)
    if "enable_thinking" in source:
        return Form("switch", "enable_thinking", history=history)
    if "<think>" in source and _GRANITE_SWITCH.search(source):
        answer = ("<response>", "</response>") if "<response>" in source else ()
        return Form("switch", "thinking", answer_tags=answer, history=history)
    if "<think>" in source and _opens(_probe(template), "<think>"):
        return Form("opened", history=history)
    if "[THINK]" in source:
        return Form("tags", open="[THINK]", close="[/THINK]", history=history)
    if "<think>" in source:
        return Form("tags", history=history)
    return NONE


def _probe(template: ChatTemplate) -> str:
    """The template's generation prompt after one user message ("" if it refuses it)."""
    try:
        return template.render([{"role": "user", "content": "Hello."}])
    except ValueError:
        return ""


def _opens(text: str, tag: str) -> bool:
    return text.rstrip().endswith(tag)


# ---- the request's side ------------------------------------------------------------------


def on(form: Form, ask: ThinkAsk) -> bool | None:
    """Whether the request asks it to think: True, False, or None for the template's default. A
    `chat_template_kwargs` that sets the template's switch decides, as llama-server takes it."""
    kwargs = ask.kwargs or {}
    for name in filter(None, (form.switch, "enable_thinking")):
        if isinstance(kwargs.get(name), bool):
            return kwargs[name]
    return ask.on


def held(ask: ThinkAsk) -> ThinkAsk:
    """What is asked of a reply held to a format or schema from its first token: no thinking (a
    grammar leaves no room for a thought; a prompt that opened one would take the JSON for it)."""
    kwargs = {k: v for k, v in (ask.kwargs or {}).items() if k not in ("enable_thinking", "thinking")}
    return ThinkAsk(on=False, kwargs=kwargs or None)


def variables(form: Form, ask: ThinkAsk) -> dict:
    """The template variables that ask what the request asks: the switch, the reasoning effort,
    then the request's own `chat_template_kwargs` (which win: the client named them)."""
    out: dict = {}
    if form.kind == "switch" and ask.on is not None:
        out[form.switch] = ask.on
    effort = ask.effort
    if form.kind == "harmony":
        # harmony knows low, medium and high; asked not to think, it thinks as little as it can
        effort = "low" if effort == "minimal" or (effort is None and ask.on is False) else effort
    if effort is not None:
        out["reasoning_effort"] = effort
    return {**out, **(ask.kwargs or {})}


def closed(prompt: ChatPrompt, form: Form, ask: ThinkAsk) -> ChatPrompt:
    """`prompt` with the thought its generation prompt opened closed at once, when the request asks
    for no thinking (Qwen3's own way: `<think>\n\n</think>\n\n`); as it is otherwise."""
    if on(form, ask) is not False or form.kind == "harmony" or not opens_thought(prompt, form):
        return prompt
    last = prompt.parts[-1]
    return ChatPrompt((*prompt.parts[:-1], Part(f"{last.text.rstrip()}\n\n{form.close}\n\n", Source.TEMPLATE)))


def opens_thought(prompt: ChatPrompt, form: Form) -> bool:
    """Whether the reply to `prompt` starts inside a thought: the template's own text ends with the
    open tag (a member's text that does is only text)."""
    last = prompt.parts[-1] if prompt.parts else None
    return form.can_think and last is not None and last.source is Source.TEMPLATE and _opens(last.text, form.open)


def splitter(form: Form, *, opened: bool = False) -> Splitter | None:
    """The splitter for a reply (`opened`: its prompt left a thought open); None when the model
    cannot think: its text is all content."""
    if form.kind == "harmony":
        return HarmonySplitter()
    if not form.can_think:
        return None
    return TagSplitter(form.open, form.close, thinking=opened, answer_tags=form.answer_tags)


THOUGHT_FIELDS = ("thinking", "reasoning_content")  # Ollama's and OpenAI's names for an earlier reply's thoughts


def history(messages: list[dict], form: Form) -> list[dict]:
    """Messages with earlier replies' thoughts under the field the template reads them from
    (gpt-oss's `thinking`, Qwen3's `reasoning_content`), or left out when it reads none: a model
    is not sent its old thoughts unless its template asks for them."""
    if not any(field in m for m in messages for field in THOUGHT_FIELDS):
        return messages
    out = []
    for message in messages:
        thought = next((message[f] for f in THOUGHT_FIELDS if message.get(f)), None)
        message = {k: v for k, v in message.items() if k not in THOUGHT_FIELDS}
        if thought and form.history is not None and message.get("role") == "assistant":
            message[form.history] = thought
        out.append(message)
    return out


def spoken(text: str) -> str:
    """`text` without a leading thought, for a voice to say (text a client hands to speech out)."""
    split = TagSplitter("<think>", "</think>")
    content = split.feed(text)[1]
    return content + split.finish()[1]


def check_kwargs(kwargs: dict | None, *, max_names: int, max_chars: int) -> str | None:
    """What is wrong with a request's `chat_template_kwargs`, or None: names that replace the
    template's own inputs, that are not names, too many, or too large."""
    if not kwargs:
        return None
    if len(kwargs) > max_names:
        return f"at most {max_names} variables"
    for name in kwargs:
        if not name.isidentifier():
            return f"{name!r} is not a template variable name"
        if name in RESERVED:
            return f"{name!r} is the template's own input; it cannot be set ({', '.join(sorted(RESERVED))})"
    if len(repr(kwargs)) > max_chars:
        return f"over {max_chars} characters"
    return None
