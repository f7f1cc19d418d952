"""A request stream to an HTTP answer: server-sent events, or one collected object.

A stream always ends with `[DONE]`: one cut short (the server stopping, a failed step) first
gets a final chunk with `finish_reason` "abort" or "error" and an error event saying why.
Either way the sequence is aborted when the answer is not read to its end: a streaming
client that goes away cancels the generator (Starlette listens for the disconnect), and
its `finally` aborts; a non-streaming client is watched by a task that aborts on
`http.disconnect`. The engine frees the sequence within one step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from homeai.api.errors import ApiError
from homeai.engine.engine import RequestStream, TokenEvent
from homeai.wire import DONE, SSE_HEADERS, error_body, sse


def sse_response(stream: RequestStream, shape, *, include_usage: bool) -> StreamingResponse:
    return StreamingResponse(_events(stream, shape, include_usage), media_type="text/event-stream",
                             headers=SSE_HEADERS)


async def _events(stream: RequestStream, shape, include_usage: bool) -> AsyncIterator[str]:
    try:
        first = shape.first_chunk()
        if first is not None:
            yield sse(first)
        async for event in stream:
            if isinstance(event, TokenEvent) and (event.text or shape.logprobs):
                for chunk in shape.text_chunks(event.text, [event]):
                    yield sse(chunk)
        finish = stream.finished
        for chunk in shape.end_chunks(finish):  # the last with finish_reason "abort" or "error" when cut short
            yield sse(chunk)
        if finish.reason in ("error", "abort"):
            yield sse(_failure(finish))
        elif include_usage:
            yield sse(shape.usage_chunk(finish))
        yield DONE
    finally:
        if stream.finished is None:
            stream.abort()


def _failure(finish) -> dict:
    if finish.reason == "abort":
        return error_body("the server is shutting down; the answer was cut short", "server_error", "shutting_down")
    return error_body(f"generation failed: {finish.error}", "server_error", "generation_failed")


async def collect(request: Request, stream: RequestStream) -> tuple[str, list[TokenEvent]]:
    """The whole text and token events of a stream; aborts if the client leaves first."""
    parts, events = [], []
    async with abort_on_disconnect(request, [stream]):
        async for event in stream:
            parts.append(event.text)
            if isinstance(event, TokenEvent):
                events.append(event)
    finish = stream.finished
    if finish.reason == "error":
        raise ApiError(500, f"generation failed: {finish.error}", code="generation_failed")
    if finish.reason == "abort":
        raise ApiError(503, "the server is shutting down; the answer was cut short", code="shutting_down",
                       headers={"Retry-After": "5"})
    return "".join(parts), events


@contextlib.asynccontextmanager
async def abort_on_disconnect(request: Request, streams: list[RequestStream]):
    """Abort `streams` if the client disconnects meanwhile, and any left unfinished at the end."""
    watcher = asyncio.create_task(_watch(request, streams))
    try:
        yield
    finally:
        watcher.cancel()
        for stream in streams:
            if stream.finished is None:
                stream.abort()


async def _watch(request: Request, streams: list[RequestStream]) -> None:
    await disconnected(request)
    for stream in streams:
        stream.abort()


async def disconnected(request: Request) -> None:
    """Return once the client has gone away; the one disconnect watcher of the API."""
    # The body has been read: the next message the server hands the app is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
