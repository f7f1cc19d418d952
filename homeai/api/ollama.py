"""Ollama's generation on homeai's port, for Home Assistant's `ollama` integration, Open WebUI and scripts.

`/api/chat`, `/api/generate` and `/api/embed` (the served model's routes, `/api/tags` and the rest,
are `homeai.api.ollama_manage`'s). Generation goes
through the same lanes as everywhere: the `X-HomeAI-Lane` header, else the member's default
lane (`homeai members add ha --lane voice`), else chat; embeddings on the embeddings lane
(a lane the member may not use: 403, `auth.lane_for`).
Work is queued by `homeai.api.submit` (fair share, queues, 429 with `Retry-After`).

Answers are Ollama's: NDJSON (`application/x-ndjson`, one object a line) when `stream` is true,
as it is by default, with the last line `done: true` and the counts and durations (ns); one
object otherwise. Every error this router raises is `{"error": "..."}` with its status (the
route class below reshapes homeai's errors); a stream cut short ends with an error line.
The body-size limit and the shutdown refusal answer before any route, in OpenAI's shape.

Tool calling and structured output (`format`) go through `homeai.tools`, as on `/v1`: the tools
in the model's call format, the reply held to their schemas by a grammar, and a call sent whole,
in one line, with `arguments` an object. Ollama has no `tool_choice` ("auto" always); homeai takes
one as its own field, as on `/v1`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated

import numpy as np
from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from homeai.api import ollama_models
from homeai.config import GrammarConfig
from homeai.api.auth import CurrentMember, lane_for
from homeai.api.deps import EngineDep, LaneHeader, RuntimeDep
from homeai.api.errors import ApiError
from homeai.api.limits import check_generation
from homeai.api.ollama_route import NDJSON, line, now, ollama_router
from homeai.api.ollama_schemas import ChatRequest, EmbedRequest, GenerateRequest, Generating
from homeai.api.openai import _submit_embeds as submit_embeds
from homeai.api.openai import chat_template, tool_error, tool_plan
from homeai.api.streaming import abort_on_disconnect, collect
from homeai.api.submit import off_loop, submit
from homeai.engine.engine import Engine, FinishEvent, RequestStream, TokenEvent
from homeai.sched.request import Grammar
from homeai.tools import ToolCall, ToolError, ToolPlan, checked_grammar, ollama_format_grammar
from lanes.base import LanePolicy

log = logging.getLogger("homeai.api")

NS_PER_MS = 1_000_000


# ---- tool calling and structured output ----------------------------------------------------


def chat_prompt(engine: Engine, messages: list[dict], plan: ToolPlan | None) -> str:
    """The prompt for a chat, with the tools in the form the model's template takes them."""
    return chat_template(engine.runner, plan)(messages)


def format_grammar(format: str | dict | None, runner, limits: GrammarConfig) -> Grammar | None:
    """The grammar that holds an answer to `format` ("json" or a JSON schema); None for free text."""
    return _grammar(None, format, runner, limits)


def _ollama_calls(calls: tuple[ToolCall, ...]) -> list[dict]:
    return [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]


router = ollama_router()


def generation_lane(runtime: RuntimeDep, member: CurrentMember, lane_header: LaneHeader = None) -> str:
    """The header's lane, else the member's default lane, else chat; one they may use."""
    return lane_for(runtime, member, lane_header, member.default_lane or "chat")[0]


GenerationLane = Annotated[str, Depends(generation_lane)]


# ---- generation -----------------------------------------------------------------------------


@router.post("/chat")
async def chat(body: ChatRequest, request: Request, runtime: RuntimeDep, engine: EngineDep, member: CurrentMember,
               lane: GenerationLane) -> Response:
    started = time.perf_counter_ns()
    model, policy = _generation(runtime, body, lane, num_messages=len(body.messages))
    reply = Reply(model, "chat")
    if not body.messages:  # Ollama's way to load a model: answered at once, it is loaded
        return reply.loaded()
    messages = [m.for_template() for m in body.messages]
    plan = await asyncio.to_thread(tool_plan, engine.runner, [t.model_dump(exclude_none=True) for t in body.tools or ()],
                                   body.tool_choice)  # validating large schemas takes a while: off the loop
    if plan is not None and body.format is not None:
        raise ApiError(400, "format cannot be combined with tools")
    reply = Reply(model, "chat", plan)
    grammar = await asyncio.to_thread(_grammar, plan, body.format, engine.runner, runtime.cfg.grammar)
    params = dataclasses.replace(body.sampling(policy, runtime.cfg.server.max_output_tokens), grammar=grammar)
    stream = await submit(engine, lambda: chat_prompt(engine, messages, plan), lane=lane, member=member.name,
                          params=params, prompt_param="messages")
    return await _answer(request, stream, reply, stream_lines=body.stream, started=started)


@router.post("/generate")
async def generate(body: GenerateRequest, request: Request, runtime: RuntimeDep, engine: EngineDep,
                   member: CurrentMember, lane: GenerationLane) -> Response:
    started = time.perf_counter_ns()
    model, policy = _generation(runtime, body, lane)
    reply = Reply(model, "generate")
    if not body.prompt:
        return reply.loaded()

    def prompt() -> str:
        if body.raw:
            return body.prompt
        system = [{"role": "system", "content": body.system}] if body.system else []
        return engine.runner.apply_chat_template([*system, {"role": "user", "content": body.prompt}])

    grammar = await asyncio.to_thread(format_grammar, body.format, engine.runner, runtime.cfg.grammar)
    params = dataclasses.replace(body.sampling(policy, runtime.cfg.server.max_output_tokens), grammar=grammar)
    stream = await submit(engine, prompt, lane=lane, member=member.name, params=params, prompt_param="prompt")
    return await _answer(request, stream, reply, stream_lines=body.stream, started=started)


def _generation(runtime, body: Generating, lane: str, num_messages: int = 0) -> tuple[str, LanePolicy]:
    """The served model's name and the lane's policy, once the request is known to be servable."""
    model = _model(runtime, body.model, "generate")
    policy = _policy(runtime, lane)
    check_generation(runtime.cfg.server, max_tokens=None, num_messages=num_messages)
    return model, policy


def _grammar(plan: ToolPlan | None, format, runner, limits: GrammarConfig) -> Grammar | None:
    """The tools' grammar, else the format's, bounded and checked (`checked_grammar` blocks for up to
    `[grammar] build_timeout_s`: called off the loop)."""
    make = plan.grammar if plan is not None else lambda bounds: ollama_format_grammar(format, bounds)
    try:
        return checked_grammar(make, runner, limits)
    except ToolError as e:
        raise tool_error(e) from None


async def _answer(request: Request, stream: RequestStream, reply: "Reply", *, stream_lines: bool,
                  started: int) -> Response:
    if stream_lines:
        return StreamingResponse(_lines(stream, reply, started), media_type=NDJSON)
    text, _events = await collect(request, stream)
    return JSONResponse(reply.done(text, stream.finished, started))


async def _lines(stream: RequestStream, reply: "Reply", started: int) -> AsyncIterator[str]:
    """The answer a line at a time; a client that leaves cancels this, and `finally` aborts."""
    try:
        async for event in stream:
            if isinstance(event, TokenEvent) and event.text:
                for piece in reply.pieces(event.text):
                    yield line(piece)
        finish = stream.finished
        for piece in reply.end(finish.text):  # text held back, then the calls not sent yet
            yield line(piece)
        if finish.reason == "error":
            yield line({"error": f"generation failed: {finish.error}"})
        elif finish.reason == "abort":
            yield line({"error": "the server is shutting down; the answer was cut short"})
        else:
            yield line(reply.done("", finish, started))
    finally:
        if stream.finished is None:
            stream.abort()


class Reply:
    """One answer's lines: pieces of text, then the last line with its counts and durations. With a
    tool plan, text that may open a call is held back, and each call goes out whole in a line of
    its own as soon as it is written (as Ollama does)."""

    def __init__(self, model: str, endpoint: str, plan: ToolPlan | None = None):
        self.model = ollama_models.ollama_name(model)
        self.chat = endpoint == "chat"
        self.plan = plan
        self.calls = plan.stream() if plan is not None else None
        self.num_sent = 0  # calls sent

    def pieces(self, text: str) -> list[dict]:
        if self.calls is None:
            return [self.piece(text)] if text else []
        text = self.calls.feed(text)
        return [*([self.piece(text)] if text else []), *self._call_lines(self.calls.new_calls())]

    def end(self, text: str) -> list[dict]:
        """The lines before the last: text held back, and the calls not sent yet."""
        if self.calls is None:
            return [self.piece(text)] if text else []
        self.calls.feed(text)
        rest, parsed = self.calls.finish()
        return [*([self.piece(rest)] if rest else []), *self._call_lines(parsed.calls[self.num_sent:])]

    def _call_lines(self, calls) -> list[dict]:
        self.num_sent += len(calls)
        return [{**self._head(), "message": {"role": "assistant", "content": "", "tool_calls": _ollama_calls([c])},
                 "done": False} for c in calls]

    def _head(self) -> dict:
        return {"model": self.model, "created_at": now()}

    def _text(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}} if self.chat else {"response": text}

    def piece(self, text: str) -> dict:
        return {**self._head(), **self._text(text), "done": False}

    def loaded(self) -> JSONResponse:
        return JSONResponse({**self._head(), **self._text(""), "done": True, "done_reason": "load"})

    def done(self, text: str, finish: FinishEvent, started: int) -> dict:
        """The last line; for a whole answer (`text`), with its calls parsed out."""
        s = finish.stats
        body = self._text(text)
        if self.plan is not None and text:
            parsed = self.plan.parse(text)
            body["message"]["content"] = parsed.content or ""
            if parsed.calls:
                body["message"]["tool_calls"] = _ollama_calls(parsed.calls)
        queued_ns = round((s.queue_ms or 0) * NS_PER_MS)
        first_ns = round((s.ttft_ms or s.e2e_ms) * NS_PER_MS)
        return {**self._head(), **body, "done": True,
                "done_reason": "length" if finish.reason == "length" else "stop",
                "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
                "prompt_eval_count": s.prompt_tokens, "prompt_eval_duration": max(0, first_ns - queued_ns),
                "eval_count": s.output_tokens, "eval_duration": max(0, round(s.e2e_ms * NS_PER_MS) - first_ns)}


# ---- embeddings -----------------------------------------------------------------------------


@router.post("/embed")
async def embed(body: EmbedRequest, request: Request, runtime: RuntimeDep, engine: EngineDep,
                member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    """Ollama's embeddings: one L2-normalised vector per input, from the embeddings lane."""
    started = time.perf_counter_ns()
    model = _model(runtime, body.model, "embed")
    lane = lane_for(runtime, member, lane_header, "embeddings")[0]
    policy = _policy(runtime, lane)
    inputs = body.inputs()
    if not inputs or len(inputs) > policy.max_queue:
        raise ApiError(400, f"input: between 1 and {policy.max_queue} inputs (lane {lane!r} queues at most that)")
    n_embd = engine.runner.info.embed_n_embd
    if body.dimensions is not None and body.dimensions != n_embd:
        raise ApiError(400, f"dimensions: this model's embeddings have {n_embd}")
    loop = asyncio.get_running_loop()
    streams = await off_loop(lambda: submit_embeds(engine, inputs, lane, member.name, loop), engine=engine,
                             lane=lane, prompt_param="input")
    async with abort_on_disconnect(request, streams):
        for stream in streams:
            async for _ in stream:
                pass
    vectors, num_tokens = [], 0
    for stream in streams:
        finish = stream.finished
        if finish.reason != "stop":
            raise ApiError(500, f"embedding failed: {finish.error or finish.reason}")
        vectors.append(_normalised(finish.embedding))
        num_tokens += finish.stats.prompt_tokens
    return JSONResponse({"model": ollama_models.ollama_name(model), "embeddings": vectors,
                         "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
                         "prompt_eval_count": num_tokens})


# ---- helpers --------------------------------------------------------------------------------


def _model(runtime, name: str, purpose: str) -> str:
    """The served model's id for `purpose`; 404 as Ollama words it, 400 for a model that does not do it."""
    served = ollama_models.served(runtime, name)
    if served is None:
        raise ApiError(404, ollama_models.not_found(name))
    if purpose not in served[1]:
        doing = "embeddings" if purpose == "embed" else "generation"
        raise ApiError(400, f'"{name}" does not support {doing}')
    return served[0].id


def _policy(runtime, lane: str) -> LanePolicy:
    """The policy of `lane`, a lane the member may use (`lane_for`), once known to be served here."""
    if runtime.remotes.get(lane) is not None:
        raise ApiError(400, f"lane {lane!r} is served by a remote server; use the OpenAI API (/v1) for it")
    return runtime.cfg.lanes[lane]


def _normalised(vector) -> list[float]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return (array / norm if norm > 0 else array).tolist()


