"""Request bodies of the Ollama-compatible endpoints (`homeai.api.ollama`), and their sampling.

Ollama's own rules: fields and options a client sends that homeai does not use are ignored
(`mirostat`, ...); a known one with a wrong type is a 400, as it is for
the OpenAI bodies (strict types, finite numbers, valid Unicode: `RequestBody`). `stream`
defaults to true. Images are refused where they enter: this model reads text only.
`think` is true or false, or a level ("low", "medium", "high"), as Ollama takes it; anything else
is a 400 in Ollama's words (`homeai.service.thinking` says what it does to each model; a model
that cannot think is a 400 for true or a level, from the route).
`keep_alive` is read only for Ollama's unload call (0 with nothing to answer): the household's
one model stays loaded whatever a client asks. `lane` is homeai's own field, as on `/v1`: the
lane asked for, honoured when the member may use it (403 otherwise, 400 for no such lane).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from homeai.api.errors import ApiError
from homeai.api.schemas import MAX_INT64, MAX_TOP_K, MIN_INT64, Body, RequestBody
from homeai.engine.prompt import image_mark
from homeai.service import ChatAsk, CompletionAsk, EmbedAsk, ImageIn, SamplingAsk, ThinkAsk
from homeai.service.sampling import MAX_STOPS

Format = Literal["json", ""] | dict[str, Any]
JSON_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
THINK_LEVELS = ("high", "medium", "low")
ZERO_DURATION = re.compile(r"0+(\.0*)?(ns|us|µs|ms|s|m|h)?")  # "0", "0s", "0.0m": Go's durations, or seconds


class Options(Body):
    """Ollama's `options`: the ones homeai's sampler has; the rest (mirostat, num_gpu, ...) ignored."""

    num_ctx: int | None = Field(None, ge=1)  # the lane's cache bounds the context whatever this says
    num_predict: int | None = Field(None, ge=-2)  # -1 (no limit) and -2 (fill the context): the lane's cap
    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = Field(None, ge=MIN_INT64, le=MAX_INT64)
    stop: list[str] | None = Field(None, max_length=MAX_STOPS)
    repeat_penalty: float | None = Field(None, gt=0)


class Generating(RequestBody):
    """What `/api/chat` and `/api/generate` share."""

    model: str
    format: Format | None = None
    options: Options | None = None
    stream: bool = True
    keep_alive: str | int | float | None = None  # 0: Ollama's unload (see `unloads`); else ignored
    think: Any = None  # true, false, or "low" / "medium" / "high" (checked below, in Ollama's words)
    lane: str | None = None  # homeai's: the lane asked for, as on /v1 (also X-HomeAI-Lane, or `<model>:<lane>`)

    def unloads(self) -> bool:
        """`keep_alive` is zero (0, 0.0, "0", "0s"): with nothing to answer, Ollama's unload call."""
        if isinstance(self.keep_alive, str):
            return bool(ZERO_DURATION.fullmatch(self.keep_alive.strip()))
        return self.keep_alive == 0

    @field_validator("think", mode="before")
    @classmethod
    def _think_value(cls, value):
        if value is None or isinstance(value, bool) or value in THINK_LEVELS:
            return value
        shown = f'"{value}"' if isinstance(value, str) else json.dumps(value)
        raise ApiError(400, f'invalid think value: {shown} (must be "high", "medium", "low", true, or false)')

    def thinks(self) -> bool:
        """`think` asks the model to think (true or a level)."""
        return self.think is True or self.think in THINK_LEVELS

    def think_ask(self) -> ThinkAsk:
        if self.think in THINK_LEVELS:
            return ThinkAsk(on=True, effort=self.think)
        return ThinkAsk(on=self.think)

    @field_validator("format")
    @classmethod
    def _format_shape(cls, value):
        if isinstance(value, dict):
            kind = value.get("type")
            kinds = kind if isinstance(kind, list) else [kind]
            if kind is not None and not all(k in JSON_SCHEMA_TYPES for k in kinds):
                raise ValueError(f"not a JSON schema type: {kind!r}")
        return value or None  # "" means no format, as Ollama takes it

    def sampling(self) -> SamplingAsk:
        """What the options ask of the sampler; the service fills the defaults and the lane's cap
        (`num_predict` -1, no limit, and -2, fill the context, both mean the lane's cap)."""
        o = self.options or Options()
        wanted = o.num_predict if o.num_predict and o.num_predict > 0 else None
        return SamplingAsk(max_tokens=wanted, temperature=o.temperature, top_p=o.top_p, top_k=o.top_k, min_p=o.min_p,
                           repeat_penalty=o.repeat_penalty, seed=o.seed, stop=tuple(o.stop or ()),
                           max_tokens_param="num_predict")


class ToolFunctionCall(Body):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class ToolCall(Body):
    function: ToolFunctionCall


class ChatMessage(Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""  # null as Ollama takes it: no text (an assistant turn that only calls tools)
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # the tool a `role: "tool"` result answers (Ollama has no call ids)
    thinking: str | None = None  # an earlier reply's thoughts: sent back only to a template that reads them

    def for_template(self, images: list[ImageIn] | None = None, index: int = 0) -> dict:
        """The message as the chat template takes it, tool calls and the tool's name kept; its images
        appended to `images`, their marks (`image_mark`) before its text, as Ollama places them."""
        content = self.content or ""
        if self.images and images is not None:
            if self.role != "user":
                raise ApiError(400, f"messages.{index}.images: images are read in user messages only")
            marks = []
            for i, data in enumerate(self.images):
                marks.append(image_mark(len(images)) + "\n")
                images.append(ImageIn(data, f"messages.{index}.images.{i}"))
            content = "".join(marks) + content
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.thinking and self.role == "assistant":
            message["thinking"] = self.thinking
        if self.tool_calls:
            message["tool_calls"] = [{"function": c.function.model_dump(exclude_none=True)} for c in self.tool_calls]
        if self.tool_name:  # Ollama's name for it, and the one Hugging Face templates read
            message["tool_name"] = message["name"] = self.tool_name
        return message


class ToolFunction(Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(Body):
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatRequest(Generating):
    messages: list[ChatMessage] = Field(default_factory=list)  # none: Ollama's "load the model" call
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None  # homeai's own (Ollama has none): as on /v1, default "auto"

    def ask(self, lane: str, model: str) -> ChatAsk:
        images: list[ImageIn] = []
        messages = [m.for_template(images, i) for i, m in enumerate(self.messages)]
        return ChatAsk(messages, lane=lane, model=model, images=tuple(images),
                       tools=[t.model_dump(exclude_none=True) for t in self.tools or ()], tool_choice=self.tool_choice,
                       structured=self.format, structured_kind="ollama", sampling=self.sampling(),
                       think=self.think_ask(), streamed=self.stream)


class GenerateRequest(Generating):
    prompt: str = ""  # empty: Ollama's "load the model" call
    system: str | None = None
    raw: bool = False  # the prompt as it is, no chat template
    suffix: str | None = None
    images: list[str] | None = None

    def ask(self, lane: str, model: str) -> CompletionAsk:
        """The prompt as it is (`raw`), else as a user turn after `system` in the chat template."""
        return CompletionAsk(self.prompt, lane=lane, model=model, system=self.system, template=not self.raw,
                             structured=self.format, structured_kind="ollama", sampling=self.sampling(),
                             think=self.think_ask(),
                             images=tuple(ImageIn(data, f"images.{i}") for i, data in enumerate(self.images or ())))

    @field_validator("suffix")
    @classmethod
    def _no_fill_in(cls, suffix):
        if suffix:
            raise ApiError(400, "suffix: fill-in-the-middle is not supported")
        return suffix


class EmbedRequest(RequestBody):
    model: str
    input: str | list[str]
    truncate: bool = True  # Ollama cuts long inputs; homeai refuses them clearly instead
    dimensions: int | None = Field(None, ge=1)
    options: dict[str, Any] | None = None  # nothing in them applies to embeddings
    keep_alive: str | int | float | None = None
    lane: str | None = None  # homeai's: the lane asked for, as on /v1 (default: embeddings)

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)

    def ask(self, lane: str, model: str) -> EmbedAsk:
        return EmbedAsk(self.inputs(), lane=lane, model=model)


class EmbeddingsRequest(RequestBody):
    """Ollama's older `/api/embeddings`: one `prompt`, one `embedding` (empty prompt: loaded, `[]`)."""

    model: str
    prompt: str = ""
    options: dict[str, Any] | None = None  # nothing in them applies to embeddings
    keep_alive: str | int | float | None = None
    lane: str | None = None  # homeai's: the lane asked for, as on /v1 (default: embeddings)

    def ask(self, lane: str, model: str) -> EmbedAsk:
        return EmbedAsk([self.prompt], lane=lane, model=model, prompt_param="prompt")


class ModelRequest(RequestBody):
    """`/api/show` and `/api/pull`: the model by `model`, or by `name` as older clients send it."""

    model: str | None = None
    name: str | None = None
    stream: bool = True  # pull only
    insecure: bool = False  # pull only: nothing is downloaded
    verbose: bool = False  # show only

    def requested(self) -> str:
        model = self.model or self.name
        if not model:
            raise ApiError(400, "model is required")
        return model
