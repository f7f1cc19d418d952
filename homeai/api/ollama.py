"""Ollama's API on homeai's port, for Home Assistant's `ollama` integration, Open WebUI and scripts.

`/api/version`, `/api/tags`, `/api/show`, `/api/ps`, `/api/pull` (the served model answers
success, nothing is downloaded), `/api/chat`, `/api/generate` and `/api/embed`. Generation goes
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
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from homeai import __version__
from homeai.api import ollama_models
from homeai.config import GrammarConfig
from homeai.api.auth import CurrentMember, current_member, lane_for
from homeai.api.deps import EngineDep, LaneHeader, RuntimeDep
from homeai.api.errors import ApiError
from homeai.api.limits import check_generation
from homeai.api.ollama_schemas import ChatRequest, EmbedRequest, GenerateRequest, Generating, ModelRequest
from homeai.api.openai import _submit_embeds as submit_embeds
from homeai.api.openai import chat_template, tool_error, tool_plan
from homeai.api.streaming import abort_on_disconnect, collect
from homeai.api.submit import off_loop, submit
from homeai.engine.engine import Engine, FinishEvent, RequestStream, TokenEvent
from homeai.sched.request import Grammar
from homeai.tools import ToolCall, ToolError, ToolPlan, checked_grammar, ollama_format_grammar
from lanes.base import LanePolicy

log = logging.getLogger("homeai.api")

OLLAMA_VERSION = "0.12.0"  # the Ollama API this answers as: clients gate features (tools, think) on it
NDJSON = "application/x-ndjson"
NS_PER_MS = 1_000_000


# ---- tool calling and structured output ----------------------------------------------------

# Every served model takes tools: in its template's own call format, or in the generic one
# (described in the system prompt, held to the schemas by a grammar) when its template has none.
TOOL_CALLING = True


def capabilities(purposes: set[str]) -> list[str]:
    """What `/api/show` says a served model can do (Home Assistant offers tools only with "tools")."""
    out = []
    if "generate" in purposes:
        out += ["completion", "tools"] if TOOL_CALLING else ["completion"]
    if "embed" in purposes:
        out.append("embedding")
    return out


def chat_prompt(engine: Engine, messages: list[dict], plan: ToolPlan | None) -> str:
    """The prompt for a chat, with the tools in the form the model's template takes them."""
    return chat_template(engine.runner, plan)(messages)


def format_grammar(format: str | dict | None, runner, limits: GrammarConfig) -> Grammar | None:
    """The grammar that holds an answer to `format` ("json" or a JSON schema); None for free text."""
    return _grammar(None, format, runner, limits)


def _ollama_calls(calls: tuple[ToolCall, ...]) -> list[dict]:
    return [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]


# ---- errors in Ollama's shape ---------------------------------------------------------------

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
ERROR_RESPONSES = {status: {"description": description, "content": {"application/json": {"schema": ERROR_SCHEMA}}}
                   for status, description in ((400, "The request is not valid"), (401, "Missing or invalid token"),
                                               (404, "The model is not served here"), (429, "The lane's queue is full"),
                                               (503, "Not loaded yet"))}


def error_response(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class OllamaRoute(APIRoute):
    """A route whose errors, its dependencies' and body validation's included, are Ollama's `{"error": "..."}`,
    and whose body is JSON whatever its content type, as Ollama reads it (`curl -d` sends a form's)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()
        has_body = self.body_field is not None

        async def answer(request: Request) -> Response:
            if has_body:
                request = _as_json(request)
            try:
                return await handler(request)
            except ApiError as exc:
                return error_response(exc.status_code, exc.message, exc.headers)
            except RequestValidationError as exc:
                return error_response(400, _invalid(exc))
            except HTTPException as exc:
                return error_response(exc.status_code, str(exc.detail), exc.headers)
            except Exception:
                log.exception("unhandled error in %s", request.url.path)
                return error_response(500, "internal server error")

        return answer


def _as_json(request: Request) -> Request:
    """The request with its body declared JSON: FastAPI parses a body as JSON only when it says so."""
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
    scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}
    return Request(scope, request.receive)


def _invalid(exc: RequestValidationError) -> str:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return "the body is not valid JSON"
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))


router = APIRouter(prefix="/api", tags=["ollama"], route_class=OllamaRoute, responses=ERROR_RESPONSES,
                   dependencies=[Depends(current_member)])


def generation_lane(runtime: RuntimeDep, member: CurrentMember, lane_header: LaneHeader = None) -> str:
    """The header's lane, else the member's default lane, else chat; one they may use."""
    return lane_for(runtime, member, lane_header, member.default_lane or "chat")[0]


GenerationLane = Annotated[str, Depends(generation_lane)]


# ---- the served model -----------------------------------------------------------------------


@router.get("/version")
def version() -> dict:
    return {"version": OLLAMA_VERSION, "homeai": __version__}


@router.get("/tags")
def tags(runtime: RuntimeDep, _engine: EngineDep) -> dict:
    """A plain function: the first call reads the GGUF headers, in a worker thread."""
    return {"models": [ollama_models.tag_entry(card) for card in runtime.cards()]}


@router.get("/ps")
def ps(runtime: RuntimeDep, engine: EngineDep) -> dict:
    on_gpu = engine.runner.info.gpu_offload
    return {"models": [ollama_models.ps_entry(card, context_length=_context_length(engine), on_gpu=on_gpu)
                       for card in runtime.cards()]}


@router.post("/show")
def show(body: ModelRequest, runtime: RuntimeDep, engine: EngineDep, member: CurrentMember) -> dict:
    """The model file's path for an admin; its name only for other members."""
    card, purposes = _card(runtime, body.requested())
    return ollama_models.show(card, capabilities=capabilities(purposes), context_length=_context_length(engine),
                              full_path=member.is_admin)


@router.post("/pull")
def pull(body: ModelRequest, runtime: RuntimeDep, _engine: EngineDep) -> Response:
    """The served model is there already: success, and nothing downloaded. Any other name is an error."""
    name = body.requested()
    if _served(runtime, name) is None:
        served = ", ".join(ollama_models.ollama_name(c.id) for c in runtime.cards())
        raise ApiError(404, f'model "{name}" is not served here and homeai downloads no models (it serves {served})')
    if not body.stream:
        return JSONResponse({"status": "success"})
    return Response("".join(_line({"status": s}) for s in ("pulling manifest", "success")), media_type=NDJSON)


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
                for line in reply.pieces(event.text):
                    yield _line(line)
        finish = stream.finished
        for line in reply.end(finish.text):  # text held back, then the calls not sent yet
            yield _line(line)
        if finish.reason == "error":
            yield _line({"error": f"generation failed: {finish.error}"})
        elif finish.reason == "abort":
            yield _line({"error": "the server is shutting down; the answer was cut short"})
        else:
            yield _line(reply.done("", finish, started))
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
        return {"model": self.model, "created_at": _now()}

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


def _served(runtime, name: str) -> tuple[object, set[str]] | None:
    """The served card `name` names (`<id>`, `<id>:latest`, the file's name, or an alias) and its purposes."""
    bare = name.removesuffix(f":{ollama_models.TAG}")
    found = None
    purposes = set()
    for purpose in ("generate", "embed"):
        if runtime.resolve_model(bare, purpose) is not None:
            found = found or runtime.models[purpose]
            if runtime.models[purpose] == found:
                purposes.add(purpose)
    return (found, purposes) if found is not None else None


def _card(runtime, name: str):
    served = _served(runtime, name)
    if served is None:
        raise ApiError(404, _not_found(name))
    return served


def _model(runtime, name: str, purpose: str) -> str:
    """The served model's id for `purpose`; 404 as Ollama words it, 400 for a model that does not do it."""
    served = _served(runtime, name)
    if served is None:
        raise ApiError(404, _not_found(name))
    if purpose not in served[1]:
        doing = "embeddings" if purpose == "embed" else "generation"
        raise ApiError(400, f'"{name}" does not support {doing}')
    return served[0].id


def _not_found(name: str) -> str:
    return f'model "{name}" not found, try pulling it first'


def _policy(runtime, lane: str) -> LanePolicy:
    """The policy of `lane`, a lane the member may use (`lane_for`), once known to be served here."""
    if runtime.remotes.get(lane) is not None:
        raise ApiError(400, f"lane {lane!r} is served by a remote server; use the OpenAI API (/v1) for it")
    return runtime.cfg.lanes[lane]


def _context_length(engine: Engine) -> int:
    return engine.max_seq_len_for("chat") if "chat" in engine.policies else engine.max_seq_len


def _normalised(vector) -> list[float]:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return (array / norm if norm > 0 else array).tolist()


def _line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
