"""Where a request goes: the local engine, or the remote server that serves its lane.

Routes validate, pick the lane, and hand `serve` a `local` coroutine function; a lane with a
`[remote.<lane>]` is relayed by its `homeai.remote.relay.RemoteLane` instead, and this module
is the FastAPI side of that: the client's body read, the work cancelled when the client leaves
(the remote then sees its request dropped) or the server stops (503), a stream wrapped in a
response that frees it however it ends, and the remote's refusals as API errors: a full gate
429, a closed one 503, a client error (4xx) relayed as it came, a remote that cannot be
reached, times out or fails 502/504 in OpenAI's error shape, or answered by the local model
instead when `fallback_local` is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from homeai.api.errors import ApiError
from homeai.api.streaming import disconnected
from homeai.remote import GateClosed, QueueFull, RemoteFailure  # a remote lane's gate full: QueueFull
from homeai.remote.relay import Relay, RemoteLane, RemoteLanes
from homeai.wire import SSE_HEADERS

__all__ = ["Local", "RemoteLanes", "serve"]

Local = Callable[[bool], Awaitable[Response]]  # local(fallback): the local answer


async def serve(remotes: RemoteLanes, request: Request, path: str, *, lane: str, member: str, stream: bool,
                local: Local) -> Response:
    """The answer to a validated request on `lane`: from its remote if it has one (`remotes`, the
    service's), else local."""
    remote = remotes.get(lane)
    if remote is None:
        return await local(False)
    return await _forward(remote, request, path, member=member, stream=stream, local=local)


async def _forward(remote: RemoteLane, request: Request, path: str, *, member: str, stream: bool,
                   local: Local) -> Response:
    body = remote.body_for(await request.json())
    try:
        return await _guarded(remote, request, _send(remote, path, body, member, stream))
    except QueueFull as exc:
        raise ApiError(429, str(exc), code="queue_full", param="lane", headers={"Retry-After": "1"}) from None
    except GateClosed as exc:
        raise ApiError(503, str(exc), code="shutting_down", headers={"Retry-After": "5"}) from None
    except RemoteFailure as failure:
        if not failure.remote_fault:
            return _relayed_refusal(failure)
        if remote.falls_back(failure):
            return await local(True)
        raise ApiError(failure.status, failure.message, code=failure.code, type="server_error") from None


async def _send(remote: RemoteLane, path: str, body: dict, member: str, stream: bool) -> Response:
    sent = await remote.send(path, body, member=member, stream=stream)
    if isinstance(sent, Relay):
        return RelayResponse(sent)
    return Response(sent.content, status_code=sent.status_code, media_type="application/json")


async def _guarded(remote: RemoteLane, request: Request, work: Awaitable[Response]) -> Response:
    """Run `work`, cancelled if the client goes away or the server stops (503)."""
    task = asyncio.ensure_future(work)
    remote.tasks.add(task)
    watcher = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler is cancelled: free a stream it will never return
        task.add_done_callback(_close_unreturned)
        raise
    finally:
        remote.tasks.discard(task)
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done():  # the client left: nobody reads the answer
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=499)
    if task.cancelled():
        raise GateClosed("the server is shutting down")
    return task.result()


class RelayResponse(StreamingResponse):
    """A relayed stream whose remote response and gate slot are freed however it ends, even
    when the client leaves before the first chunk."""

    def __init__(self, relay: Relay):
        super().__init__(relay.events(), media_type="text/event-stream", headers=SSE_HEADERS)
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.relay.close()


def _close_unreturned(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is None and isinstance(task.result(), RelayResponse):
        asyncio.ensure_future(task.result().relay.close())


def _relayed_refusal(failure: RemoteFailure) -> Response:
    """A client error from the remote (a 4xx), relayed as it came."""
    media_type = failure.headers.pop("content-type", "application/json")
    return Response(failure.body or b"", status_code=failure.status, media_type=media_type, headers=failure.headers)
