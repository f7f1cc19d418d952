"""An answer stream (`homeai.service.answer`) as an HTTP answer: server-sent events, or one object.

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
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from homeai.service.answer import Answer, Done, Failed, Whole
from homeai.wire import DONE, SSE_HEADERS, sse

T = TypeVar("T")


def sse_response(answer: Answer, shape, *, include_usage: bool) -> StreamingResponse:
    return StreamingResponse(_events(answer, shape, include_usage), media_type="text/event-stream",
                             headers=SSE_HEADERS)


async def _events(answer: Answer, shape, include_usage: bool) -> AsyncIterator[str]:
    try:
        first = shape.first_chunk()
        if first is not None:
            yield sse(first)
        async for event in answer:
            for chunk in shape.chunks(event):
                yield sse(chunk)
            if isinstance(event, Failed):
                yield sse(event.error.body())
            elif isinstance(event, Done) and include_usage:
                yield sse(shape.usage_chunk(event.usage))
        yield DONE
    finally:
        answer.abort()


async def collect(request: Request, answer: Answer) -> Whole:
    """The whole answer; aborts if the client leaves first. Raises the ServiceError of one cut short."""
    async with abort_on_disconnect(request, [answer]):
        return await answer.whole()


async def until_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result; None, with `work` cancelled, if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return None if task.cancelled() else task.result()


@contextlib.asynccontextmanager
async def abort_on_disconnect(request: Request, answers: list):
    """Abort `answers` (anything with `abort()`) if the client disconnects meanwhile, and any left
    unfinished at the end."""
    watcher = asyncio.create_task(_watch(request, answers))
    try:
        yield
    finally:
        watcher.cancel()
        for answer in answers:
            if not answer.finished:
                answer.abort()


async def _watch(request: Request, answers: list) -> None:
    await disconnected(request)
    for answer in answers:
        answer.abort()


async def disconnected(request: Request) -> None:
    """Return once the client has gone away; the one disconnect watcher of the API."""
    # The body has been read: the next message the server hands the app is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
