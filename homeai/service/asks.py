"""What a protocol asks the service for, once it has read its request: plain dataclasses.

The protocol names its fields for errors (`prompt_param`, `SamplingAsk.max_tokens_param`): a
refusal names the field the client sent, whatever protocol it spoke.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from homeai.service.sampling import SamplingAsk


@dataclass(frozen=True)
class ThinkAsk:
    """What a request asks of a model that can think (`homeai.service.thinking`)."""

    on: bool | None = None  # think or not; None: the template's default (Qwen3 thinks, Granite does not)
    effort: str | None = None  # "minimal" | "low" | "medium" | "high": the template's `reasoning_effort`
    kwargs: dict | None = None  # OpenAI's `chat_template_kwargs`: further template variables, checked


@dataclass(frozen=True)
class ImageIn:
    """An image as a client sent it, read in a worker (`homeai.service.images`): Ollama's base64, or
    OpenAI's `image_url` (a data URL). Its message's text holds `homeai.engine.prompt.image_mark(i)`
    where it sits, i its index in the ask's `images`."""

    data: str
    param: str  # the field it came in, for errors (`messages.1.images.0`)
    url: bool = False  # OpenAI's image_url (data URLs only), else Ollama's base64 (or a data URL)


@dataclass(frozen=True)
class ChatAsk:
    messages: list[dict]  # as the chat template takes them (role, content, tool_calls, ...)
    lane: str  # resolved by `service.lane` (checked again)
    model: str | None = None  # a name or alias of the served model; None: the served one
    tools: list | None = None  # OpenAI-shaped tool definitions, checked by homeai.tools
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    structured: dict | str | None = None  # OpenAI's `response_format`, or Ollama's `format`
    structured_kind: str = "openai"  # "openai" | "ollama"
    sampling: SamplingAsk = field(default_factory=SamplingAsk)
    documents: bool = False  # answer from the household's indexed documents, citing them
    fit: str = "refuse"  # "refuse": too long is a 400; "latest": keep the latest turns that fit
    prompt_param: str = "messages"  # the request field the prompt came from, for errors
    think: ThinkAsk = field(default_factory=ThinkAsk)
    streamed: bool = False  # the answer is streamed: someone reads it as it is written (never a background task)
    images: tuple[ImageIn, ...] = ()  # the messages' images, each where its mark is in their text


@dataclass(frozen=True)
class CompletionAsk:
    prompt: str | list[int]  # text or token ids
    lane: str
    model: str | None = None
    system: str | None = None  # with `template`: a system message before the prompt
    template: bool = False  # the prompt as a user turn in the chat template (Ollama's generate)
    structured: dict | str | None = None
    structured_kind: str = "openai"
    sampling: SamplingAsk = field(default_factory=SamplingAsk)
    prompt_param: str = "prompt"
    think: ThinkAsk = field(default_factory=ThinkAsk)  # with `template`: as a chat's
    images: tuple[ImageIn, ...] = ()  # with `template`: before the prompt in its user turn


@dataclass(frozen=True)
class EmbedAsk:
    inputs: list[str | list[int]]  # one vector per input; all or none
    lane: str
    model: str | None = None
    prompt_param: str = "input"


@dataclass(frozen=True)
class Embeddings:
    vectors: list  # one per input, as the model gives them
    num_tokens: int
    model: str
