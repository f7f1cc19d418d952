"""Request bodies of the OpenAI-compatible endpoints, and their sampling parameters.

Fields clients commonly send that homeai does not use (`user`, `frequency_penalty`, ...)
are accepted and ignored, as OpenAI-compatible servers do; a known field with a wrong
type or value is a 400. `lane` is homeai's own field (OpenAI clients send it through
`extra_body`), as are `top_k`, `min_p` and `repeat_penalty`.

Types are strict, as OpenAI's are: `"stream": "yes"` or `"max_tokens": "4"` is refused, not
coerced; numbers are finite and within what the sampler takes. Every string (and key) of a
body must be valid Unicode: JSON's `\ud800` escapes can spell a lone surrogate, which UTF-8
cannot encode and the tokenizer cannot take (400 `invalid_text`, checked once per body by
`RequestBody`, with `homeai.service.text.find_invalid_text`).

`tools`, `tool_choice`, `parallel_tool_calls` and `response_format` are taken as sent and checked
by `homeai.tools`, which names the field at fault (`tools.0.function.parameters`).

Thinking as llama-server and vLLM take it: `reasoning_effort` ("none" asks for no thinking; the
others ask for thinking at that effort, passed to the template as `reasoning_effort`) and
`chat_template_kwargs` (further template variables: `enable_thinking`, ...; at most
`MAX_TEMPLATE_KWARGS` names, `MAX_TEMPLATE_KWARGS_CHARS` in all, never the template's own inputs).
A model that cannot think ignores both, as those servers do. An assistant message's
`reasoning_content` is sent back only to a template that reads earlier thoughts.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from homeai.api.errors import ApiError
from homeai.engine.prompt import image_mark
from homeai.service import ChatAsk, CompletionAsk, EmbedAsk, ImageIn, SamplingAsk, ThinkAsk
from homeai.service.sampling import MAX_STOPS
from homeai.service.text import find_invalid_text
from homeai.service.thinking import check_kwargs

MAX_TOP_K = 2**31 - 1  # llama.cpp's sampler takes an int32 (any k past the vocabulary keeps every token)
MIN_INT64, MAX_INT64 = -(2**63), 2**63 - 1  # OpenAI's range for seed
MAX_TEMPLATE_KWARGS = 32  # names in `chat_template_kwargs`
MAX_TEMPLATE_KWARGS_CHARS = 16_384  # its values in all, as Python writes them


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class RequestBody(Body):
    """A whole request body: its text is checked before any field is."""

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        path = find_invalid_text(data)
        if path is not None:  # an HTTPException passes through FastAPI's validation untouched
            raise ApiError(400, f"{path or 'the body'}: not valid Unicode text (a lone surrogate, \\ud800-\\udfff)",
                           code="invalid_text", param=path or None)
        return data


class ImageUrl(Body):
    url: str
    detail: str | None = None  # OpenAI's "low" | "high" | "auto": the projector reads an image at its own size


class TextPart(Body):
    """A content part: text, or an image (`image_url`, a data URL: a remote one is never fetched)."""

    type: str
    text: str | None = None
    image_url: ImageUrl | str | None = None  # (some clients send the URL as a string)


class FunctionCall(Body):
    name: str
    arguments: str | dict[str, Any] = "{}"  # JSON text, as OpenAI sends it (some clients send the object)


class ToolCallIn(Body):
    """An earlier call of the assistant's, as the client sends it back in the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # the call a tool result answers (some clients send none)
    name: str | None = None
    reasoning_content: str | None = None  # an earlier reply's thoughts, as llama-server and vLLM send them

    def for_template(self, images: list[ImageIn] | None = None, index: int = 0) -> dict:
        """The message as the template takes it; its images (`image_url` parts) appended to `images`,
        each's mark (`image_mark`) where it sits in the text (`index`: the message's, for errors)."""
        role = "system" if self.role == "developer" else self.role
        message = {"role": role, "content": self._text(images, index)}
        if self.tool_calls:
            message["tool_calls"] = [c.model_dump(exclude_none=True) for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        if self.reasoning_content and role == "assistant":
            message["reasoning_content"] = self.reasoning_content
        return message

    def _text(self, images: list[ImageIn] | None, index: int) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        text = []
        for i, part in enumerate(self.content):
            if part.type == "text":
                text.append(part.text or "")
            elif part.type == "image_url" and part.image_url is not None and images is not None:
                if self.role != "user":
                    raise ApiError(400, "images are read in user messages only", code="unsupported_content",
                                   param=f"messages.{index}.content.{i}")
                url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
                text.append(image_mark(len(images)) + "\n")
                images.append(ImageIn(url, f"messages.{index}.content.{i}.image_url", url=True))
            else:
                raise ApiError(400, f"content parts of type {part.type!r} are not supported (text and image_url are)",
                               code="unsupported_content", param=f"messages.{index}.content.{i}")
        return "".join(text)


class StreamOptions(Body):
    include_usage: bool = False


class Sampling(RequestBody):
    """What every generating endpoint takes."""

    model: str | None = None
    lane: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, gt=0)
    seed: int | None = Field(None, ge=MIN_INT64, le=MAX_INT64)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling_ask(self, *, max_tokens: int | None, logprobs: int | None,
                     max_tokens_param: str = "max_tokens") -> SamplingAsk:
        """What this body asks of the sampler; the service fills the defaults (and refuses n > 1)."""
        return SamplingAsk(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                           min_p=self.min_p, repeat_penalty=self.repeat_penalty, seed=self.seed, stop=self.stop,
                           logprobs=logprobs, n=self.n, max_tokens_param=max_tokens_param)


class ChatCompletionRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    # Checked by homeai.tools, which names the field at fault (tools.0.function.parameters, ...).
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    documents: bool = False  # homeai: answer from the household's indexed documents, citing them
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def ask(self, lane: str, model: str | None) -> ChatAsk:
        """The service's question: `model` None for the served one."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", code="invalid_value", param="top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        sampling = self.sampling_ask(max_tokens=self.max_completion_tokens or self.max_tokens, logprobs=logprobs,
                                     max_tokens_param=self.max_tokens_param)
        images: list[ImageIn] = []
        messages = [m.for_template(images, i) for i, m in enumerate(self.messages)]
        return ChatAsk(messages, lane=lane, model=model, tools=self.tools, images=tuple(images),
                       tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls,
                       structured=self.response_format, sampling=sampling, documents=self.documents,
                       think=self.think_ask(), streamed=self.stream)

    def think_ask(self) -> ThinkAsk:
        """What `reasoning_effort` and `chat_template_kwargs` ask of a model that thinks."""
        wrong = check_kwargs(self.chat_template_kwargs, max_names=MAX_TEMPLATE_KWARGS,
                             max_chars=MAX_TEMPLATE_KWARGS_CHARS)
        if wrong:
            raise ApiError(400, f"chat_template_kwargs: {wrong}", code="invalid_value", param="chat_template_kwargs")
        effort = self.reasoning_effort
        on = None if effort is None else effort != "none"
        return ThinkAsk(on=on, effort=effort if on else None, kwargs=self.chat_template_kwargs or None)


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str]
    response_format: dict[str, Any] | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    def ask(self, lane: str, model: str | None) -> CompletionAsk:
        if self.echo:
            raise ApiError(400, "echo is not supported", code="invalid_value", param="echo")
        return CompletionAsk(self.one_prompt(), lane=lane, model=model, structured=self.response_format,
                             sampling=self.sampling_ask(max_tokens=self.max_tokens, logprobs=self.logprobs))

    def one_prompt(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise ApiError(400, "only one prompt per request is supported", code="invalid_value", param="prompt")
            return self.prompt[0]
        return self.prompt


class EmbeddingRequest(RequestBody):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    lane: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)

    def inputs(self) -> list[str | list[int]]:
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]
        if not self.input:
            raise ApiError(400, "input must not be empty", code="invalid_value", param="input")
        return list(self.input)

    def ask(self, lane: str, model: str | None) -> EmbedAsk:
        return EmbedAsk(self.inputs(), lane=lane, model=model)
