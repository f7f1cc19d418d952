"""The model's own chat template: `tokenizer.chat_template` from the GGUF, rendered with Jinja2.

A GGUF's template is code written by whoever packed the model, so it runs in Jinja's immutable
sandbox: no attribute starting with `_`, no changing the messages. Templates are written for
Hugging Face's `apply_chat_template`, so the environment is the one they expect there:
`trim_blocks` and `lstrip_blocks`, loop controls (`break`, `continue`), a `{% generation %}`
block that renders its body, a `tojson` that does not HTML-escape and takes `indent`,
`ensure_ascii`, `separators` and `sort_keys`, and the globals `raise_exception` and
`strftime_now`. The template is compiled once, at load; a template that does not compile is a
`TemplateCompileError` then, not a surprise in the middle of a request. Messages a template
refuses (its `raise_exception`) or cannot render are a `ChatRenderError`, which the API answers
with a 400.

Text is text: only the template's own markers are control tokens. `ChatTemplate.prompt` renders
with every string a member wrote (message content, tool calls and results, tool definitions)
wrapped in `Marks`, random markers that survive rendering, then splits the text on them into
`Part`s: the template's own text (its control tokens parsed), text the server wrote (`ServerText`,
a lane's configured prompt), the client's text (tool definitions, and system messages before the
first message of another role, unless the caller says they are not: `prompt`'s `client`) and
members' text; the runner tokenizes the last three as plain text, so a member's `<|im_start|>` is
characters, not a turn. A control token's text inside a member's string is wrapped on its own as
well, so a template that slices a string (`content.split(...)`) cannot
carry it out of its markers; text a template moved out of order is members' text. The leading
parts no member wrote are the prompt's public prefix (`PromptTokens.public_len`); those no user
wrote, the client's included, its client prefix (`PromptTokens.client_len`), which only the users
of one trusted proxy share (homeai/sched/prefix.py). The client's text is a member's for anything
else: between members it is never shared.

`choose` picks what the runner formats chats with, always a Jinja2 template: the one named by
`model.chat_template` (a family homeai knows, or a file), else the GGUF's own, else (it has none,
or it does not compile) the built-in template of the family the model speaks (homeai.engine.families),
with a line saying which and why for the start log and `homeai doctor`. A name that is neither a
family nor a file is an `UnknownTemplate`, which stops the start.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from homeai.engine import families
from homeai.engine.prompt import MARKED, ChatPrompt, Marks, Part, Source, for_template

log = logging.getLogger("homeai.engine")


class TemplateCompileError(ValueError):
    """The GGUF's chat template is not a template Jinja2 can compile."""


class UnknownTemplate(TemplateCompileError):
    """`model.chat_template` names neither a turn format homeai knows nor a file."""


class ChatRenderError(ValueError):
    """The chat template refused these messages or failed on them: the request's fault, a 400."""


class _Refused(Exception):
    """Raised by the template's own `raise_exception`, so its message reaches the client as written."""


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's part for training; here it
    renders its body and nothing else."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(value, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """JSON as the template's authors saw it in Transformers: not HTML-escaped (Jinja's own escapes
    `<`, `>`, `&` and `'`, which would change the prompt), non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _trim(value, chars: str | None = None) -> str:
    """Jinja's `trim`, reaching inside a member's markers (Llama 3 and Gemma trim each message)."""
    text = str(value).strip(chars)
    marked = MARKED.fullmatch(text)
    if marked is None:
        return text
    opening, inner, closing = marked.groups()
    return opening + inner.strip(chars) + closing


def _raise_exception(message: str):
    raise _Refused(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.filters["trim"] = _trim
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env


class ChatTemplate:
    """One model's chat template, compiled once; `render` is safe to call from any thread."""

    def __init__(self, source: str, *, bos_token: str, eos_token: str):
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as e:
            where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
            raise TemplateCompileError(f"the chat template does not compile: {e.message or e}{where}") from None
        self.system_role = self._takes_system_messages()

    def _takes_system_messages(self) -> bool:
        """Whether the template writes a system message (Gemma 2's refuses one; Gemma 1's drops it)."""
        probe = f"system-{secrets.token_hex(8)}"
        try:
            return probe in self._render([{"role": "system", "content": probe}, {"role": "user", "content": "hi"}],
                                         None, True, None)
        except Exception:  # noqa: BLE001 - a template that fails on the probe does not take them
            return False

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               add_generation_prompt: bool = True, extra: dict | None = None) -> str:
        """The prompt text for `messages` (OpenAI-shaped dicts) and, if any, `tools` (OpenAI's
        `{"type": "function", "function": {...}}` entries, passed to the template as they are;
        without any, `tools` is undefined, as llama.cpp leaves it: Phi-4-mini's template tests
        `tools is defined`). `extra` are further variables for the template (`enable_thinking`,
        `reasoning_effort`: what a request's `chat_template_kwargs` or `think` set); they cannot
        replace the ones named here. For a template that takes no system message, its text opens
        the next user message instead (llama.cpp does the same), so Home Assistant's system prompt
        reaches Gemma 2 rather than being refused."""
        messages = [for_template(m) for m in messages]
        if not self.system_role:
            messages = _system_folded(messages)
        try:
            return self._render(messages, tools, add_generation_prompt, extra)
        except _Refused as e:
            raise ChatRenderError(f"the model's chat template refused these messages: {e}") from None
        except Exception as e:  # the template is code: any failure on these messages is a refusal, not a crash
            raise ChatRenderError(f"the model's chat template could not render these messages: "
                                  f"{type(e).__name__}: {e}") from None

    def _render(self, messages: list[dict], tools, add_generation_prompt: bool, extra: dict | None) -> str:
        variables = {k: v for k, v in (extra or {}).items() if k != "tools"}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token)
        if tools:
            variables["tools"] = tools
        return self._template.render(**variables)


    def prompt(self, messages: list[dict], tools: list[dict] | None = None, *, tokenizer_adds_bos: bool,
               control_texts: Sequence[str] = (), extra: dict | None = None, client: bool = True) -> "ChatPrompt":
        """The prompt for a reply, in parts: the template's own text, and the strings members wrote
        (`control_texts`: the vocabulary's control tokens, wrapped apart inside them). Templates
        often write `bos_token` first; a tokenizer that adds BOS itself would then give two, so the
        prompt leaves it out and the tokenizer puts it back (llama-server does the same). A
        tokenizer that adds none keeps the template's. `client`: the tools and leading system
        messages are the client's (`Source.CLIENT`); False: a user's (messages the server opened
        with text a user's question chose, retrieved documents)."""
        marks = Marks(control_texts, (messages, tools), client=client)
        text = self.render(marks.messages(messages), marks.tools(tools), add_generation_prompt=True, extra=extra)
        prompt = marks.split(text)
        first = prompt.parts[0] if prompt.parts else None
        if (tokenizer_adds_bos and self.bos_token and first is not None and first.source is Source.TEMPLATE
                and first.text.startswith(self.bos_token)):
            rest = first.text[len(self.bos_token):]
            return ChatPrompt(((Part(rest, Source.TEMPLATE),) if rest else ()) + prompt.parts[1:])
        return prompt


def _system_folded(messages: list[dict]) -> list[dict]:
    """System messages' text moved into the user message after them (or, with none after them, into
    one of its own), for a template that takes no system message."""
    if any(not isinstance(m.get("content") or "", str) for m in messages):
        return messages  # content parts: the template's own business
    out: list[dict] = []
    held: list[str] = []
    for message in messages:
        if message.get("role") == "system":
            held.append(message.get("content") or "")
            continue
        if held and message.get("role") == "user":
            message = {**message, "content": "\n\n".join([*held, message.get("content") or ""])}
            held = []
        out.append(message)
    if held:
        out.append({"role": "user", "content": "\n\n".join(held)})
    return out


@dataclass(frozen=True)
class TemplateChoice:
    """What the runner formats chats with, and why."""

    template: ChatTemplate
    name: str  # "gguf" (the model's own), "file" (model.chat_template's), or a built-in family's name
    description: str  # one line for the start log and `homeai doctor`
    error: str | None = None  # why the model's own template is not in use, when it has one
    guessed: bool = False  # a built-in template nothing in the model named: the fallback


def choose(source: str | None, *, bos_token: str, eos_token: str, architecture: str = "",
           control_texts: Sequence[str] = (), configured: str = "") -> TemplateChoice:
    """The template `configured` names (`model.chat_template`: a family or a file), else the
    model's own when it has one that compiles, else the built-in one of the family it speaks.

    A GGUF template that does not compile is replaced rather than stopping the server (llama-server
    does the same): the household keeps a working assistant while the start log and `homeai doctor`
    say what is wrong. A configured one that does not, or a name that is neither a family nor a
    file, is the user's to fix: `TemplateCompileError` (`UnknownTemplate`)."""
    if configured:
        return _configured(configured, bos_token, eos_token)
    error = None
    if source:
        try:
            return TemplateChoice(ChatTemplate(source, bos_token=bos_token, eos_token=eos_token), "gguf",
                                  "the model's own (tokenizer.chat_template, in a Jinja2 sandbox)")
        except TemplateCompileError as e:
            error = str(e)
    found = families.detect(architecture, control_texts)
    why = "the model's own does not compile" if error else "the GGUF has no chat template"
    return TemplateChoice(ChatTemplate(found.family.source, bos_token=bos_token, eos_token=eos_token),
                          found.family.name, f"{found.family.name} (built in: {why}; {found.reason})",
                          error=error, guessed=found.guessed)


def _configured(configured: str, bos_token: str, eos_token: str) -> TemplateChoice:
    family = families.BY_NAME.get(configured)
    if family is not None:
        return TemplateChoice(ChatTemplate(family.source, bos_token=bos_token, eos_token=eos_token), family.name,
                              f"{family.name} (built in; model.chat_template)")
    path = Path(configured).expanduser()
    if not path.is_file():
        raise UnknownTemplate(f"model.chat_template = {configured!r} is neither a turn format homeai knows "
                              f"({', '.join(families.NAMES)}) nor a file")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TemplateCompileError(f"model.chat_template: {path} cannot be read: {e}") from None
    try:
        template = ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
    except TemplateCompileError as e:
        raise TemplateCompileError(f"model.chat_template: {path}: {e}") from None
    return TemplateChoice(template, "file", f"the file {path} (model.chat_template)")


def check_configured(configured: str) -> None:
    """`model.chat_template` checked before the model loads (`homeai serve`), so that a name
    that is neither a family nor a file, or a file that does not compile, stops the start."""
    if configured:
        _configured(configured, bos_token="", eos_token="")


def load(source: str | None, *, bos_token: str, eos_token: str, architecture: str = "",
         control_texts: Sequence[str] = (), configured: str = "") -> TemplateChoice:
    """`choose`, said in the log once, when the model loads."""
    choice = choose(source, bos_token=bos_token, eos_token=eos_token, architecture=architecture,
                    control_texts=control_texts, configured=configured)
    if choice.error:
        log.warning("%s; formatting chats with %s", choice.error, choice.description)
    elif choice.guessed:
        log.warning("chat template: %s; name one with model.chat_template (%s, or a Jinja2 file) if "
                    "answers run on past their turn", choice.description, ", ".join(families.NAMES))
    else:
        log.info("chat template: %s", choice.description)
    return choice
