"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`.

A route resolves the lane (body `lane`, else the `X-HomeAI-Lane` header, else the endpoint's
default; one the member may not use is a 403: `auth.lane_for`), checks the client's limits,
and hands `dispatch.serve` its local answer: the model and the sampling parameters resolved,
submitted to the engine, and what comes back shaped. A lane served by a remote server
(`[remote.<lane>]`) is forwarded there instead. Submitting goes through `homeai.api.submit`
(off the event loop, refusals as API errors).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from homeai import tools
from homeai.api import dispatch
from homeai.api.auth import CurrentMember, current_member, lane_for
from homeai.api.deps import EngineDep, LaneHeader, RuntimeDep, get_engine
from homeai.api.errors import ApiError
from homeai.api.limits import check_generation
from homeai.api.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from homeai.api.shapes import ChatShape, CompletionShape
from homeai.api.streaming import abort_on_disconnect, collect, sse_response
from homeai.api.submit import off_loop, submit
from homeai.engine.engine import Engine, RequestStream
from homeai.sched.request import Grammar, Kind
from lanes import chat as chat_lane

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[Depends(current_member)])


@router.get("/models")
def list_models(runtime: RuntimeDep, _engine: EngineDep) -> dict:
    data = [{"id": card.id, "object": "model", "created": card.created, "owned_by": "homeai"}
            for card in runtime.cards()]
    return {"object": "list", "data": data}


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, runtime: RuntimeDep,
                           member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    lane, policy = lane_for(runtime, member, body.lane or lane_header, "chat")
    max_tokens_param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    check_generation(runtime.cfg.server, max_tokens=body.max_completion_tokens or body.max_tokens,
                     num_messages=len(body.messages), max_tokens_param=max_tokens_param)

    async def local(fallback: bool) -> Response:
        engine = get_engine(runtime)
        model = _model(runtime, None if fallback else body.model, "generate")
        runner = engine.runner
        plan = await asyncio.to_thread(tool_plan, runner, body.tools, body.tool_choice, body.parallel_tool_calls)
        if plan is not None and body.response_format not in (None, {"type": "text"}):
            raise ApiError(400, "response_format cannot be combined with tools", code="invalid_value",
                           param="response_format")
        grammar = await _grammar(runtime, runner, plan.grammar if plan else
                                 lambda limits: tools.response_format_grammar(body.response_format, limits))
        params = dataclasses.replace(body.sampling(policy), grammar=grammar)
        messages = [m.for_template() for m in body.messages]
        docs, citations = await _documents(request, messages) if body.documents else ("", [])

        def prompt() -> list[int]:  # every message kept: the client chose them; too long is its 400
            return chat_lane.build_prompt(messages, docs, None, template=chat_template(runner, plan),
                                          tokenize=runner.tokenize)

        stream = await submit(engine, prompt, lane=lane, member=member.name, params=params,
                              prompt_param="messages")
        shape = ChatShape(model, engine.runner.piece, logprobs=body.logprobs, plan=plan)
        if body.stream:
            response = sse_response(stream, shape, include_usage=body.include_usage)
            if citations:
                response.headers["X-HomeAI-Citations"] = json.dumps(citations, separators=(",", ":"))
            return response
        text, events = await collect(request, stream)
        whole = shape.whole(text, events, stream.finished)
        if body.documents:
            whole["citations"] = citations
        return JSONResponse(whole)

    return await dispatch.serve(runtime, request, "/chat/completions", lane=lane, member=member.name,
                                stream=body.stream, local=local)


async def _documents(request: Request, messages: list[dict]) -> tuple[str, list[dict]]:
    """The household's chunks best matching the question, as the chat lane's document context
    (a system message's text, "" when none match), and the citations to return."""
    jobs = getattr(request.app.state, "jobs", None)
    if jobs is None:
        raise ApiError(400, "this server indexes no documents", code="documents_unavailable", param="documents")
    system_text, citations = await jobs.build_document_context(chat_lane.question(messages),
                                                               chat_lane.MAX_DOCUMENTS)
    if not system_text:
        return "", []
    return system_text, [{k: c[k] for k in ("n", "path", "score", "snippet")} for c in citations]


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request, runtime: RuntimeDep,
                      member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    lane, policy = lane_for(runtime, member, body.lane or lane_header, "chat")
    check_generation(runtime.cfg.server, max_tokens=body.max_tokens)

    async def local(fallback: bool) -> Response:
        engine = get_engine(runtime)
        model = _model(runtime, None if fallback else body.model, "generate")
        grammar = await _grammar(runtime, engine.runner,
                                 lambda limits: tools.response_format_grammar(body.response_format, limits))
        params = dataclasses.replace(body.sampling(policy), grammar=grammar)
        prompt = body.one_prompt()
        stream = await submit(engine, lambda: prompt, lane=lane, member=member.name, params=params,
                              prompt_param="prompt")
        shape = CompletionShape(model, engine.runner.piece, logprobs=body.logprobs is not None)
        if body.stream:
            return sse_response(stream, shape, include_usage=body.include_usage)
        text, events = await collect(request, stream)
        return JSONResponse(shape.whole(text, events, stream.finished))

    return await dispatch.serve(runtime, request, "/completions", lane=lane, member=member.name,
                                stream=body.stream, local=local)


@router.post("/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request, runtime: RuntimeDep,
                     member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    lane, policy = lane_for(runtime, member, body.lane or lane_header, "embeddings")
    inputs = body.inputs()
    if len(inputs) > policy.max_queue:
        raise ApiError(400, f"{len(inputs)} inputs, but lane {lane!r} queues at most {policy.max_queue}",
                       code="too_many_inputs", param="input")

    async def local(fallback: bool) -> Response:
        engine = get_engine(runtime)
        model = _model(runtime, None if fallback else body.model, "embed")
        return await _embed(engine, request, body, inputs, lane=lane, member=member.name, model=model)

    return await dispatch.serve(runtime, request, "/embeddings", lane=lane, member=member.name, stream=False,
                                local=local)


async def _embed(engine: Engine, request: Request, body: EmbeddingRequest, inputs: list, *, lane: str,
                 member: str, model: str) -> Response:
    n_embd = engine.runner.info.embed_n_embd
    if body.dimensions is not None and body.dimensions != n_embd:
        raise ApiError(400, f"this model's embeddings have {n_embd} dimensions", code="invalid_value",
                       param="dimensions")
    loop = asyncio.get_running_loop()
    streams = await off_loop(lambda: _submit_embeds(engine, inputs, lane, member, loop), lane=lane,
                             engine=engine, prompt_param="input")
    async with abort_on_disconnect(request, streams):
        for stream in streams:
            async for _ in stream:
                pass
    data, num_tokens = [], 0
    for index, stream in enumerate(streams):
        finish = stream.finished
        if finish.reason != "stop":
            raise ApiError(500, f"embedding failed: {finish.error or finish.reason}", code="embedding_failed")
        data.append({"object": "embedding", "index": index,
                     "embedding": _encode(finish.embedding, body.encoding_format)})
        num_tokens += finish.stats.prompt_tokens
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})


# ---- helpers ----------------------------------------------------------------------------


def tool_error(error: tools.ToolError) -> ApiError:
    return ApiError(400, str(error), code="invalid_value", param=error.param)


def tool_plan(runner, tool_list, tool_choice, parallel_tool_calls: bool = True) -> tools.ToolPlan | None:
    """The request's tool plan, in the call format of the model's template; bad input is a 400."""
    source = runner.chat.template.source if runner.chat.template is not None else None
    try:
        return tools.plan(tool_list, tool_choice, parallel_tool_calls, template_source=source)
    except tools.ToolError as e:
        raise tool_error(e) from None


def chat_template(runner, plan: tools.ToolPlan | None):
    """Messages -> prompt text. A template that renders tools gets the plan's tools and the history as
    it is; one that knows none gets the tools in the system prompt, and earlier calls and results
    as text (with or without tools in this request)."""
    source = runner.chat.template.source if runner.chat.template is not None else None
    if plan is None and tools.for_template(source).tools_in_template:
        return runner.apply_chat_template
    if plan is None:
        return lambda messages: runner.apply_chat_template(tools.generic_messages(messages, None))
    return lambda messages: runner.apply_chat_template(plan.messages(messages), plan.template_tools())


async def _grammar(runtime, runner, make) -> Grammar | None:
    """`make(limits)`'s grammar, bounded and checked by `tools.checked_grammar` (off the event loop: the
    check may take up to `[grammar] build_timeout_s`); bad input is a 400."""
    try:
        return await asyncio.to_thread(tools.checked_grammar, make, runner, runtime.cfg.grammar)
    except tools.ToolError as e:
        raise tool_error(e) from None


def _model(runtime, requested: str | None, purpose: str) -> str:
    model = runtime.resolve_model(requested, purpose)
    if model is None:
        served = runtime.model_id(purpose)
        raise ApiError(404, f"the model {requested!r} does not exist; this server serves {served!r}",
                       code="model_not_found", param="model")
    return model


def _submit_embeds(engine: Engine, inputs: list, lane: str, member: str, loop) -> list[RequestStream]:
    """One embed request per input; all or none: a refusal aborts those already queued."""
    streams: list[RequestStream] = []
    try:
        for text in inputs:
            streams.append(engine.submit(text, lane=lane, member=member, kind=Kind.EMBED, loop=loop))
    except BaseException:
        for stream in streams:
            stream.abort()
        raise
    return streams


def _encode(vector, encoding_format: str) -> list[float] | str:
    array = np.asarray(vector, dtype="<f4")
    if encoding_format == "base64":
        return base64.b64encode(array.tobytes()).decode("ascii")
    return array.tolist()
