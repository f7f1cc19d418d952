"""OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`.

A route resolves the lane with the service (a model named `<id>:<lane>` or the body's `lane`, else
the `X-HomeAI-Lane` header, else the endpoint's default: `homeai.service.names`; one the member
may not use is a 403), checks the client's limits, and
hands `dispatch.serve` its local answer: the body as the service's question, the answer stream
(`homeai.service`) formatted as OpenAI's objects (`shapes`) whole or as server-sent events
(`streaming`). A lane served by a remote server (`[remote.<lane>]`) is forwarded there instead.
"""

from __future__ import annotations

import base64
import json

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from homeai.api import dispatch
from homeai.api.auth import CurrentMember, current_member
from homeai.api.deps import LaneHeader, ServiceDep
from homeai.api.errors import ApiError
from homeai.api.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from homeai.api.shapes import ChatShape, CompletionShape
from homeai.api.streaming import collect, sse_response, until_disconnected

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[Depends(current_member)])


@router.get("/models")
def list_models(service: ServiceDep, member: CurrentMember) -> dict:
    """The served models, then the generation model under the names of the lanes the member may use."""
    cards = service.cards()
    created = next(card.created for card in cards if card.purpose == "generate")
    # what each reads, as llama-server's /props says it (`modalities`): images once a projector is loaded
    generate = {"vision": service.sees(), "audio": False}
    ids = [(card.id, card.created, card.purpose) for card in cards]
    ids += [(name, created, "generate") for name in service.lane_names(member)]
    return {"object": "list", "data": [{"id": id_, "object": "model", "created": when, "owned_by": "homeai",
                                        **({"modalities": generate} if purpose == "generate" else {})}
                                       for id_, when, purpose in ids]}


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, service: ServiceDep,
                           member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    lane, _policy = service.request_lane(member, model=body.model, lane=body.lane, header=lane_header, default="chat")
    service.check_limits(max_tokens=body.max_completion_tokens or body.max_tokens, num_messages=len(body.messages),
                         max_tokens_param=body.max_tokens_param)

    async def local(fallback: bool) -> Response:
        answer = await service.chat(body.ask(lane, None if fallback else body.model), member)
        shape = ChatShape(answer.model, service.piece, logprobs=body.logprobs)
        if body.stream:
            response = sse_response(answer, shape, include_usage=body.include_usage)
            if answer.citations:
                response.headers["X-HomeAI-Citations"] = json.dumps(answer.citations, separators=(",", ":"))
            return response
        whole = shape.whole(await collect(request, answer))
        if body.documents:
            whole["citations"] = answer.citations
        return JSONResponse(whole)

    return await dispatch.serve(service.remotes, request, "/chat/completions", lane=lane, member=member.key,
                                stream=body.stream, local=local)


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request, service: ServiceDep,
                      member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    lane, _policy = service.request_lane(member, model=body.model, lane=body.lane, header=lane_header, default="chat")
    service.check_limits(max_tokens=body.max_tokens)

    async def local(fallback: bool) -> Response:
        answer = await service.complete(body.ask(lane, None if fallback else body.model), member)
        shape = CompletionShape(answer.model, service.piece, logprobs=body.logprobs is not None)
        if body.stream:
            return sse_response(answer, shape, include_usage=body.include_usage)
        return JSONResponse(shape.whole(await collect(request, answer)))

    return await dispatch.serve(service.remotes, request, "/completions", lane=lane, member=member.key,
                                stream=body.stream, local=local)


@router.post("/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request, service: ServiceDep,
                     member: CurrentMember, lane_header: LaneHeader = None) -> Response:
    lane, policy = service.request_lane(member, model=body.model, lane=body.lane, header=lane_header,
                                        default="embeddings")
    inputs = body.inputs()
    if len(inputs) > policy.max_queue:
        raise ApiError(400, f"{len(inputs)} inputs, but lane {lane!r} queues at most {policy.max_queue}",
                       code="too_many_inputs", param="input")

    async def local(fallback: bool) -> Response:
        model = service.model(None if fallback else body.model, "embed")
        n_embd = service.embed_dimensions()
        if body.dimensions is not None and body.dimensions != n_embd:
            raise ApiError(400, f"this model's embeddings have {n_embd} dimensions", code="invalid_value",
                           param="dimensions")
        embedded = await until_disconnected(request, service.embed(body.ask(lane, model), member))
        if embedded is None:  # the client left
            return Response(status_code=499)
        data = [{"object": "embedding", "index": i, "embedding": _encode(vector, body.encoding_format)}
                for i, vector in enumerate(embedded.vectors)]
        return JSONResponse({"object": "list", "data": data, "model": embedded.model,
                             "usage": {"prompt_tokens": embedded.num_tokens, "total_tokens": embedded.num_tokens}})

    return await dispatch.serve(service.remotes, request, "/embeddings", lane=lane, member=member.key,
                                stream=False, local=local)


def _encode(vector, encoding_format: str) -> list[float] | str:
    array = np.asarray(vector, dtype="<f4")
    if encoding_format == "base64":
        return base64.b64encode(array.tobytes()).decode("ascii")
    return array.tolist()
