"""Ollama's generation on homeai's port, for Home Assistant's `ollama` integration, Open WebUI and scripts.

`/api/chat`, `/api/generate`, `/api/embed` and the older `/api/embeddings` (the served model's routes, `/api/tags` and the rest,
are `homeai.api.ollama_manage`'s). Generation goes through the same lanes as everywhere: a model
named `<id>:<lane>` (`homeai.service.names`) or the body's `lane` (homeai's own field, as on
`/v1`), else the `X-HomeAI-Lane` header, else the member's default lane (`homeai members add ha
--lane voice`), else chat; embeddings on the embeddings lane unless named or asked otherwise. A
lane the member may not use is a 403, one that does not exist a 400, on every route. The service
(`homeai.service`) answers; this module reads Ollama's bodies and writes its lines.

Answers are Ollama's: NDJSON (`application/x-ndjson`, one object a line) when `stream` is true,
as it is by default, with the last line `done: true` and the counts and durations (ns); one
object otherwise. Every error this router raises is `{"error": "..."}` with its status
(`homeai.api.ollama_route`); a stream cut short ends with an error line. The body-size limit and
the shutdown refusal answer before any route, in OpenAI's shape.

Tool calling and structured output (`format`) are the service's, as on `/v1`: each call comes
whole, in a line of its own, with `arguments` an object. Ollama has no `tool_choice` ("auto"
always); homeai takes one as its own field, as on `/v1`.

Thinking as Ollama does it: `think` true, false or a level (`homeai.service.thinking` says what
each does to the served model's template); true or a level for a model that cannot think is a
400, `"<model>" does not support thinking`. The thoughts stream in lines of their own
(`message.thinking`, `content` ""; `/api/generate`: `thinking`, `response` ""), and come whole in
`message.thinking` (or `thinking`) of a whole answer; they are never content.

Ollama's load and unload calls (no messages or prompt; `keep_alive: 0` to unload) answer at once
with `done_reason` "load" or "unload"; the model is the household's, so it stays loaded for the
others either way. With something to answer, `keep_alive` changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

import numpy as np
from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from homeai.api import ollama_models
from homeai.api.auth import CurrentMember
from homeai.api.deps import LaneHeader, ServiceDep
from homeai.api.errors import ApiError
from homeai.api.ollama_route import NDJSON, line, now, ollama_router
from homeai.api.ollama_schemas import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, Generating
from homeai.api.streaming import collect, until_disconnected
from homeai.service import Answer, Call, Failed, Text, Thinking, Whole

NS_PER_MS = 1_000_000

router = ollama_router()


def ready(service: ServiceDep) -> None:
    """503 until the model is loaded (before the body is looked at, as every Ollama route)."""
    service.ready()


Ready = Annotated[None, Depends(ready)]


# ---- generation -----------------------------------------------------------------------------


@router.post("/chat")
async def chat(body: ChatRequest, request: Request, service: ServiceDep, _ready: Ready, member: CurrentMember,
               lane_header: LaneHeader = None) -> Response:
    started = time.perf_counter_ns()
    lane = _generation_lane(service, member, body, lane_header)
    model = _generation(service, body, lane, num_messages=len(body.messages))
    reply = Reply(model, "chat")
    if not body.messages:  # Ollama's way to load (or, keep_alive 0, unload) a model: answered at once
        return reply.loaded(body.unloads())
    answer = await service.chat(body.ask(lane, model), member)
    return await _answer(request, answer, reply, stream_lines=body.stream, started=started)


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request, service: ServiceDep, _ready: Ready,
                   member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    started = time.perf_counter_ns()
    lane = _generation_lane(service, member, body, lane_header)
    model = _generation(service, body, lane)
    reply = Reply(model, "generate")
    if not body.prompt:
        return reply.loaded(body.unloads())
    answer = await service.complete(body.ask(lane, model), member)
    return await _answer(request, answer, reply, stream_lines=body.stream, started=started)


def _generation_lane(service, member, body: Generating, lane_header: str | None) -> str:
    """The model name's or the body's lane, else the header's, else the member's default lane, else
    chat; one they may use."""
    return service.request_lane(member, model=body.model, lane=body.lane, header=lane_header,
                                default=member.default_lane or "chat")[0]


def _generation(service, body: Generating, lane: str, num_messages: int = 0) -> str:
    """The served model's id, once the request is known to be servable here."""
    model = _model(service, body.model, "generate")
    _local(service, lane)
    service.check_limits(max_tokens=None, num_messages=num_messages)
    if body.thinks() and not service.thinking_form().can_think:
        raise ApiError(400, f'"{body.model}" does not support thinking')
    return model


async def _answer(request: Request, answer: Answer, reply: "Reply", *, stream_lines: bool, started: int) -> Response:
    if stream_lines:
        return StreamingResponse(_lines(answer, reply, started), media_type=NDJSON)
    return JSONResponse(reply.whole(await collect(request, answer), started))


async def _lines(answer: Answer, reply: "Reply", started: int) -> AsyncIterator[str]:
    """The answer a line at a time; a client that leaves cancels this, and `finally` aborts."""
    try:
        async for event in answer:
            piece = reply.line(event, started)
            if piece is not None:
                yield line(piece)
    finally:
        answer.abort()


class Reply:
    """One answer's lines: pieces of text, each tool call whole in a line of its own (as Ollama
    sends them), then the last line with its counts and durations, or an error line."""

    def __init__(self, model: str, endpoint: str):
        self.model = ollama_models.ollama_name(model)
        self.chat = endpoint == "chat"

    def line(self, event, started: int) -> dict | None:
        if isinstance(event, Text):
            return self.piece(event.text) if event.text else None
        if isinstance(event, Thinking):
            return {**self._head(), **self._text("", event.text), "done": False}
        if isinstance(event, Call):
            message = {"role": "assistant", "content": "", "tool_calls": _calls([event.call])}
            return {**self._head(), "message": message, "done": False}
        if isinstance(event, Failed):
            return {"error": event.error.message}
        return self.done(self._text(""), event.reason, event.stats, started)

    def _head(self) -> dict:
        return {"model": self.model, "created_at": now()}

    def _text(self, text: str, thinking: str = "") -> dict:
        """The answer's text (and thoughts, when there are any) as Ollama's chat or generate puts it."""
        if self.chat:
            message = {"role": "assistant", "content": text}
            return {"message": {**message, "thinking": thinking} if thinking else message}
        return {"response": text, "thinking": thinking} if thinking else {"response": text}

    def piece(self, text: str) -> dict:
        return {**self._head(), **self._text(text), "done": False}

    def loaded(self, unload: bool) -> JSONResponse:
        """Ollama's answer to its load or unload call (the model stays loaded for the household)."""
        reason = "unload" if unload else "load"
        return JSONResponse({**self._head(), **self._text(""), "done": True, "done_reason": reason})

    def whole(self, w: Whole, started: int) -> dict:
        body = self._text(w.content or "", w.thinking)
        if w.calls:
            body["message"]["tool_calls"] = _calls(w.calls)
        return self.done(body, w.reason, w.stats, started)

    def done(self, body: dict, reason: str, s, started: int) -> dict:
        """The last line, with the answer's counts and durations (ns)."""
        queued_ns = round((s.queue_ms or 0) * NS_PER_MS)
        first_ns = round((s.ttft_ms or s.e2e_ms) * NS_PER_MS)
        return {**self._head(), **body, "done": True, "done_reason": "length" if reason == "length" else "stop",
                "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
                "prompt_eval_count": s.prompt_tokens, "prompt_eval_duration": max(0, first_ns - queued_ns),
                "eval_count": s.output_tokens, "eval_duration": max(0, round(s.e2e_ms * NS_PER_MS) - first_ns)}


def _calls(calls) -> list[dict]:
    return [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]


# ---- embeddings -----------------------------------------------------------------------------


@router.post("/embed")
async def embed(body: EmbedRequest, request: Request, service: ServiceDep, _ready: Ready,
                member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    """Ollama's embeddings: one L2-normalised vector per input, from the embeddings lane."""
    started = time.perf_counter_ns()
    model = _model(service, body.model, "embed")
    lane, policy = service.request_lane(member, model=body.model, lane=body.lane, header=lane_header,
                                        default="embeddings")
    _local(service, lane)
    inputs = body.inputs()
    if not inputs or len(inputs) > policy.max_queue:
        raise ApiError(400, f"input: between 1 and {policy.max_queue} inputs (lane {lane!r} queues at most that)")
    n_embd = service.embed_dimensions()
    if body.dimensions is not None and body.dimensions != n_embd:
        raise ApiError(400, f"dimensions: this model's embeddings have {n_embd}")
    embedded = await until_disconnected(request, service.embed(body.ask(lane, model), member))
    if embedded is None:  # the client left
        return Response(status_code=499)
    return JSONResponse({"model": ollama_models.ollama_name(model), "embeddings": [_normalised(v) for v in
                                                                                   embedded.vectors],
                         "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
                         "prompt_eval_count": embedded.num_tokens})


@router.post("/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request, service: ServiceDep, _ready: Ready,
                     member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    """Ollama's older embeddings: the prompt's vector as the model gives it (Ollama normalises only
    `/api/embed`'s), from the embeddings lane; an empty prompt is its load call, `[]`."""
    model = _model(service, body.model, "embed")
    lane = service.request_lane(member, model=body.model, lane=body.lane, header=lane_header,
                                default="embeddings")[0]
    _local(service, lane)
    if not body.prompt:
        return JSONResponse({"embedding": []})
    embedded = await until_disconnected(request, service.embed(body.ask(lane, model), member))
    if embedded is None:  # the client left
        return Response(status_code=499)
    return JSONResponse({"embedding": np.asarray(embedded.vectors[0], dtype=np.float32).tolist()})


# ---- helpers --------------------------------------------------------------------------------


def _model(service, name: str, purpose: str) -> str:
    """The served model's id for `purpose`; 404 as Ollama words it, 400 for a model that does not do it."""
    served = service.find_model(name.removesuffix(f":{ollama_models.TAG}"))
    if served is None:
        raise ApiError(404, ollama_models.not_found(name))
    if purpose not in served[1]:
        doing = "embeddings" if purpose == "embed" else "generation"
        raise ApiError(400, f'"{name}" does not support {doing}')
    return served[0].id


def _local(service, lane: str) -> None:
    """A lane served here: Ollama's routes do not forward to a remote server."""
    if service.remotes.get(lane) is not None:
        raise ApiError(400, f"lane {lane!r} is served by a remote server; use the OpenAI API (/v1) for it")


def _normalised(vector) -> list[float]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return (array / norm if norm > 0 else array).tolist()
