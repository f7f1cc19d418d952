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

`choose` picks what the runner formats chats with: the model's template, or, only when the
GGUF has none (or it does not compile), llama.cpp's built-in formatter, with a line saying which
for the start log and `homeai doctor`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger("homeai.engine")


class TemplateCompileError(ValueError):
    """The GGUF's chat template is not a template Jinja2 can compile."""


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


def _raise_exception(message: str):
    raise _Refused(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
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

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (OpenAI-shaped dicts) and, if any, `tools` (OpenAI's
        `{"type": "function", "function": {...}}` entries, passed to the template as they are)."""
        try:
            return self._template.render(messages=[_for_template(m) for m in messages], tools=tools or None,
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except _Refused as e:
            raise ChatRenderError(f"the model's chat template refused these messages: {e}") from None
        except Exception as e:  # the template is code: any failure on these messages is a refusal, not a crash
            raise ChatRenderError(f"the model's chat template could not render these messages: "
                                  f"{type(e).__name__}: {e}") from None


    def prompt(self, messages: list[dict], tools: list[dict] | None = None, *, tokenizer_adds_bos: bool) -> str:
        """The text to tokenize for a reply. Templates often write `bos_token` first; a tokenizer that
        adds BOS itself would then give two, so the text leaves it out and the tokenizer puts it
        back (llama-server does the same). A tokenizer that adds none keeps the template's."""
        text = self.render(messages, tools, add_generation_prompt=True)
        if tokenizer_adds_bos and self.bos_token and text.startswith(self.bos_token):
            return text[len(self.bos_token):]
        return text


def _for_template(message: dict) -> dict:
    """A message as chat templates expect it. OpenAI sends a tool call's `arguments` as a JSON string;
    templates (Qwen 2.5, Hermes, Llama 3.x, Mistral) write them with `| tojson`, so they need the
    mapping, or the prompt would hold a quoted string. An empty or null `tool_calls` is dropped:
    Llama 3.x tests `'tool_calls' in message` and would take a plain answer for a call."""
    calls = message.get("tool_calls")
    if "tool_calls" not in message or (calls and not isinstance(calls, list)):
        return message
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if calls:
        out["tool_calls"] = [_call_for_template(c) for c in calls]
    return out


def _call_for_template(call):
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return call  # not JSON: the template gets the text as sent
    if not isinstance(parsed, dict):
        return call
    return {**call, "function": {**function, "arguments": parsed}}


@dataclass(frozen=True)
class TemplateChoice:
    """What the runner formats chats with. `template` is None when it is llama.cpp's built-in formatter."""

    template: ChatTemplate | None
    description: str  # one line for the start log and `homeai doctor`
    error: str | None = None  # why the model's own template is not in use, when it has one


def choose(source: str | None, *, bos_token: str, eos_token: str) -> TemplateChoice:
    """The model's template when it has one that compiles; otherwise the built-in formatter.

    A template that does not compile is replaced by the built-in formatter rather than stopping
    the server (llama-server does the same): the household keeps a working assistant, with a
    plainer prompt, while the start log and `homeai doctor` say what is wrong."""
    if not source:
        return TemplateChoice(None, "llama.cpp's built-in formatter (the model has no chat template)")
    try:
        template = ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
    except TemplateCompileError as e:
        return TemplateChoice(None, f"llama.cpp's built-in formatter, because {e}", error=str(e))
    return TemplateChoice(template, "the model's own (tokenizer.chat_template, in a Jinja2 sandbox)")


def load(source: str | None, *, bos_token: str, eos_token: str) -> TemplateChoice:
    """`choose`, said in the log once, when the model loads."""
    choice = choose(source, bos_token=bos_token, eos_token=eos_token)
    if choice.error:
        log.warning("%s; formatting chats with llama.cpp's built-in formatter instead", choice.error)
    else:
        log.info("chat template: %s", choice.description)
    return choice
