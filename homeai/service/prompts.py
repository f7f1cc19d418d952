"""From a request to the prompt and grammar the engine takes: the tool plan, the chat template
(with the template variables the request's thinking asks: `homeai.service.thinking`), structured
output, and a conversation fitted to the context.

Everything here may block (a large schema's grammar takes a while to build and check, bounded by
`[grammar] build_timeout_s`; a long conversation takes a while to template and tokenise): the
service calls it in a worker thread. Bad input is a ServiceError naming the field.
"""

from __future__ import annotations

import dataclasses
import uuid

from homeai import tools
from homeai.config import GrammarConfig, LimitsConfig
from homeai.engine.engine import PromptTooLong
from homeai.engine.grammar_check import GrammarBusy
from homeai.sched.request import Grammar
from homeai.service import images as image_files, thinking, thoughts
from homeai.service.asks import ImageIn, ThinkAsk
from homeai.service.errors import ServiceError
from lanes import chat as chat_lane


def tool_error(error: tools.ToolError) -> ServiceError:
    return ServiceError(400, str(error), code="invalid_value", param=error.param)


def _template_source(runner) -> str | None:
    return runner.chat.template.source if runner.chat.template is not None else None


def tool_plan(runner, tool_list, tool_choice, parallel_tool_calls: bool = True) -> tools.ToolPlan | None:
    """The request's tool plan, in the call format of the model's template; bad input is a 400."""
    try:
        return tools.plan(tool_list, tool_choice, parallel_tool_calls, template_source=_template_source(runner),
                          converter=runner.schema_converter)
    except tools.ToolError as e:
        raise tool_error(e) from None


class Prompter:
    """Messages -> prompt in the model's chat template, thinking as the request asks (`think`). A
    template that renders tools gets the plan's tools and the history as it is; one that knows none
    gets the tools in the system prompt, and earlier calls and results as text (with or without
    tools in this request).
    `opened`: whether the last prompt rendered left a thought open, so the reply starts in it.
    `client`: whether its tools and leading system messages are the client's (`Source.CLIENT`)."""

    def __init__(self, runner, plan: tools.ToolPlan | None, think: ThinkAsk | None = None, client: bool = True,
                 images: tuple[ImageIn, ...] = (), limits: LimitsConfig | None = None):
        self.runner, self.plan, self.think, self.client = runner, plan, think or ThinkAsk(), client
        self.form = thinking.form_of(runner.chat.template)
        self.extra = thinking.variables(self.form, self.think) or None
        self.opened = False
        self.images, self.limits = images, limits or LimitsConfig()
        self.pictures: tuple | None = None  # the images read, at the first rendering (in the worker)
        self.holder = f"prompt-{uuid.uuid4().hex}" if images else ""  # (`ChatPrompt.holder`)

    def __call__(self, messages: list[dict]):
        prompt = self._prompt(messages)
        if not self.images:
            return prompt
        if self.pictures is None:
            self.pictures = read_images(self.images, self.limits)
        return dataclasses.replace(prompt, images=self.pictures, holder=self.holder)

    def release(self) -> None:
        """Its prompt was not queued: the images it holds in the runner go."""
        if self.holder:
            self.runner.release_images(self.holder)

    def _prompt(self, messages: list[dict]):
        messages = thinking.history(messages, self.form)
        plan = self.plan
        if plan is None:  # no tools now, but the history may hold calls and results in any client's shape
            prompt = self._render(tools.for_template(_template_source(self.runner)).messages(messages, None))
        else:
            prompt = self._render(plan.messages(messages), plan.template_tools())
        self.opened = thinking.opens_thought(prompt, self.form)
        return prompt

    def _render(self, messages: list[dict], tool_list: list | None = None):
        prompt = self.runner.apply_chat_template(messages, tool_list, extra=self.extra, client=self.client)
        return thinking.closed(prompt, self.form, self.think)

    def splitter(self) -> thoughts.Splitter | None:
        """The reply's thought splitter, once the prompt is rendered."""
        return thinking.splitter(self.form, opened=self.opened)


def grammar(runner, limits: GrammarConfig, plan: tools.ToolPlan | None, structured, kind: str,
            member: str = "") -> Grammar | None:
    """The tools' grammar, else the structured output's (`kind` "openai": a `response_format`;
    "ollama": a `format`), bounded and checked in `member`'s turn (a 429 `grammar_busy` when
    `member` has `[grammar] max_pending_checks_per_member` new grammars being checked); None for free text."""
    if plan is not None:
        make = plan.grammar
    elif kind == "ollama":
        def make(bounds):
            return tools.ollama_format_grammar(structured, bounds, converter=runner.schema_converter)
    else:
        def make(bounds):
            return tools.response_format_grammar(structured, bounds, converter=runner.schema_converter)
    try:
        return tools.checked_grammar(make, runner, limits, member)
    except tools.ToolError as e:
        raise tool_error(e) from None
    except GrammarBusy as e:
        raise ServiceError(429, str(e), code="grammar_busy", headers={"Retry-After": "1"}) from None


def chat_tokens(runner, messages: list[dict], prompter: Prompter, *, docs: str = "",
                limit: int | None = None) -> list[int]:
    """The prompt's tokens: `docs` (a system message's text) before the messages. With a `limit`
    the latest turns that fit are kept; without, every message (too long is the engine's 400)."""
    try:
        return chat_lane.build_prompt(messages, docs, limit, template=prompter, tokenize=runner.tokenize)
    except chat_lane.TooLong as e:  # the engine's refusal, so every protocol reports it alike
        prompter.release()
        raise PromptTooLong(e.num_tokens, e.limit) from None
    except BaseException:
        prompter.release()
        raise


def check_images(runner, images: tuple[ImageIn, ...], limits: LimitsConfig) -> None:
    """Refuse images a model without a projector cannot read, and too many of them (before any is read)."""
    if not images:
        return
    if not runner.info.mmproj_path:
        raise ServiceError(400, "this model cannot read images: it has no vision projector ([model] mmproj)",
                           code="images_unsupported", param=images[0].param)
    try:
        image_files.check_count(len(images), limits)
    except image_files.ImageRefused as e:
        raise ServiceError(400, str(e), code="too_many_images", param=images[-1].param) from None


def read_images(images: tuple[ImageIn, ...], limits: LimitsConfig) -> tuple:
    """The images read and checked (`homeai.service.images`: in a worker, they take a while), or a 400
    naming the one at fault."""
    pictures = []
    for image in images:
        try:
            pictures.append(image_files.from_url(image.data, limits) if image.url
                            else image_files.from_base64(image.data, limits))
        except image_files.ImageRefused as e:
            raise ServiceError(400, f"{image.param}: {e}", code="invalid_image", param=image.param) from None
    return tuple(pictures)
