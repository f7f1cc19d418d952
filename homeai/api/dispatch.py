"""Where a request goes: the local engine, or the remote server that serves its lane.

Routes validate, pick the lane, and hand `serve` a `local` coroutine function; a lane with a
`[remote.<lane>]` goes through that lane's `RemoteLane` instead:

* admission first: the `FairGate` (the lane's `max_queue`, then 429; `concurrency` in flight;
  the next slot to the member with the fewest virtual tokens);
* the client's own JSON body is forwarded (less `lane`, which travels as `X-HomeAI-Lane` so
  another homeai files it in the same lane; `model` replaced when the remote names one);
* a non-streaming answer is passed through as it came; a stream is relayed chunk by chunk
  and always ends with `[DONE]`: a remote that drops, stalls, or a server that stops ends it
  with a final chunk (`finish_reason` "error" or "abort") and an error event first;
* a remote that cannot be reached, times out or fails (502/504 in OpenAI's error shape) is
  answered by the local model instead when `fallback_local` is set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from homeai.api.errors import ApiError, error_body
from homeai.api.streaming import DONE, SSE_HEADERS, disconnected, sse
from homeai.config import Config, RemoteConfig
from homeai.remote import FairGate, GateClosed, RemoteClient, RemoteFailure, Ticket
from homeai.sched.scheduler import QueueFull

log = logging.getLogger("homeai.api")

Local = Callable[[bool], Awaitable[Response]]  # local(fallback): the local answer
CHARS_PER_TOKEN = 4  # a prompt's token estimate until the remote reports its usage
CLOSE_WAIT_S = 5.0  # relays cut short at shutdown get this long to send their last chunk


async def serve(runtime, request: Request, path: str, *, lane: str, member: str, stream: bool,
                local: Local) -> Response:
    """The answer to a validated request on `lane`: from its remote if it has one, else local."""
    remote = runtime.remotes.get(lane)
    if remote is None:
        return await local(False)
    return await remote.forward(request, path, member=member, stream=stream, local=local)


class RemoteLanes:
    """The lanes a config hands to remote servers."""

    def __init__(self, cfg: Config):
        self.lanes = {lane: RemoteLane(lane, remote, cfg) for lane, remote in cfg.remotes.items()}

    def get(self, lane: str) -> "RemoteLane | None":
        return self.lanes.get(lane)

    def snapshot(self) -> dict:
        return {lane: remote.snapshot() for lane, remote in self.lanes.items()}

    async def close(self) -> None:
        """Refuse what waits, cut what streams (each ends with a notice), close the clients."""
        await asyncio.gather(*(remote.close() for remote in self.lanes.values()))


class RemoteLane:
    def __init__(self, lane: str, cfg: RemoteConfig, config: Config):
        policy = config.lanes[lane]
        self.lane, self.cfg = lane, cfg
        self.gate = FairGate(lane, concurrency=cfg.concurrency, max_queue=policy.max_queue, weight=policy.weight,
                             w_in=config.scheduler.w_in, w_out=config.scheduler.w_out)
        self.client = RemoteClient(cfg.url, api_key=cfg.api_key, timeout_s=cfg.timeout_s,
                                   name=f"the {lane} lane's remote ({cfg.url})")
        self.relays: set[Relay] = set()
        self.tasks: set[asyncio.Task] = set()
        self.counters = {"failures": 0, "fallbacks": 0}

    async def forward(self, request: Request, path: str, *, member: str, stream: bool, local: Local) -> Response:
        body = dict(await request.json())
        body.pop("lane", None)
        if self.cfg.model:
            body["model"] = self.cfg.model
        try:
            return await self._guarded(request, self._send(path, body, member, stream))
        except QueueFull as exc:
            raise ApiError(429, str(exc), code="queue_full", param="lane", headers={"Retry-After": "1"}) from None
        except GateClosed as exc:
            raise ApiError(503, str(exc), code="shutting_down", headers={"Retry-After": "5"}) from None
        except RemoteFailure as failure:
            if not failure.remote_fault:
                return _relayed_refusal(failure)
            self.counters["failures"] += 1
            if self.cfg.fallback_local:
                self.counters["fallbacks"] += 1
                log.warning("%s; answering locally (fallback_local)", failure.message)
                return await local(True)
            raise ApiError(failure.status, failure.message, code=failure.code, type="server_error") from None

    async def _guarded(self, request: Request, work: Awaitable[Response]) -> Response:
        """Run `work`, cancelled if the client goes away (the remote then sees its request dropped)
        or the server stops (503)."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        watcher = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this handler is cancelled: free a stream it will never return
            task.add_done_callback(_close_unreturned)
            raise
        finally:
            self.tasks.discard(task)
            watcher.cancel()
            if not task.done():
                task.cancel()
        if not task.done():  # the client left: nobody reads the answer
            await asyncio.gather(task, return_exceptions=True)
            return Response(status_code=499)
        if task.cancelled():
            raise GateClosed("the server is shutting down")
        return task.result()

    async def _send(self, path: str, body: dict, member: str, stream: bool) -> Response:
        ticket = await self.gate.acquire(member, _prompt_estimate(body))
        try:
            if stream:
                wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
                response = await self.client.open_stream(path, body, self._headers())
                relay = Relay(self, response, ticket, path, wants_usage=wants_usage)
                self.relays.add(relay)
                return RelayResponse(relay)
            response = await self.client.post(path, body, self._headers())
            usage = _usage(response)
            ticket.settle(num_prompt=usage.get("prompt_tokens"), num_output=usage.get("completion_tokens") or 0)
            ticket.release()
            return Response(response.content, status_code=response.status_code, media_type="application/json")
        except BaseException:
            ticket.release()
            raise

    def _headers(self) -> dict[str, str]:
        return {"X-HomeAI-Lane": self.lane}

    def snapshot(self) -> dict:
        return {"url": self.cfg.url, "fallback_local": self.cfg.fallback_local, "streaming": len(self.relays),
                **self.gate.snapshot(), **self.counters}

    async def close(self) -> None:
        self.gate.close()
        for task in list(self.tasks):
            task.cancel()
        for relay in list(self.relays):
            relay.stop()
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self.relays and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self.client.aclose()


class Relay:
    """One remote stream relayed as it comes; it ends with `[DONE]` whatever happens."""

    def __init__(self, lane: RemoteLane, response: httpx.Response, ticket: Ticket, path: str, *, wants_usage: bool):
        self.lane, self.response, self.ticket = lane, response, ticket
        self.wants_usage = wants_usage  # the client asked for the usage chunk; else it was ours, dropped
        self.chat = path.endswith("/chat/completions")
        self.head = {"id": f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}",
                     "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": int(time.time()), "model": ""}
        self.finished = False  # a chunk with a finish_reason went through
        self.num_chunks = 0
        self.usage: dict = {}
        self.queue: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self._released = self._response_closed = False

    def stop(self) -> None:
        """The server is stopping: end the stream now."""
        self.queue.put_nowait(_SHUTDOWN)

    async def events(self) -> AsyncIterator[str]:
        self._reader = asyncio.ensure_future(self._read())
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, str):
                    out = self._line(item)
                    if out is DONE:
                        yield DONE
                        return
                    if out:
                        yield out
                    continue
                if item is _SHUTDOWN:
                    yield self._cut("abort", "shutting_down", "the server is shutting down; the answer was cut short")
                elif isinstance(item, RemoteFailure):
                    yield self._cut("error", item.code, item.message)
                else:
                    yield self._cut("error", "remote_failed", f"{self.lane.client.name} ended the stream early")
                return
        finally:
            await self.close()

    async def _read(self) -> None:
        try:
            async for line in self.lane.client.lines(self.response):
                await self.queue.put(line)
            await self.queue.put(_END)
        except RemoteFailure as failure:
            await self.queue.put(failure)

    def _line(self, line: str) -> str | None:
        if not line.startswith("data:"):
            return None
        payload = line[5:].strip()
        if payload == "[DONE]":
            return DONE
        try:
            doc = json.loads(payload)
        except ValueError:
            return f"data: {payload}\n\n"
        if isinstance(doc, dict):
            if doc.get("usage"):
                self.usage = doc["usage"]
                if not doc.get("choices") and not self.wants_usage:
                    return None
            self._note(doc)
        return f"data: {payload}\n\n"

    def _note(self, doc: dict) -> None:
        for key in ("id", "object", "created", "model"):
            if key in doc:
                self.head[key] = doc[key]
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict):
                self.num_chunks += 1
                self.finished = self.finished or choice.get("finish_reason") is not None

    def _cut(self, reason: str, code: str, message: str) -> str:
        error = sse(error_body(message, "server_error", code))
        if self.finished:
            return error + DONE
        choice = {"index": 0, "delta": {}} if self.chat else {"index": 0, "text": ""}
        chunk = {**self.head, "choices": [{**choice, "logprobs": None, "finish_reason": reason}]}
        return sse(chunk) + error + DONE

    async def close(self) -> None:
        # The bookkeeping first, with no await: a cancelled stream may be interrupted at the next one.
        if not self._released:
            self._released = True
            if self._reader is not None:
                self._reader.cancel()
            self.ticket.settle(num_prompt=self.usage.get("prompt_tokens"),
                               num_output=self.usage.get("completion_tokens") or self.num_chunks)
            self.ticket.release()
            self.lane.relays.discard(self)
        if not self._response_closed:
            try:
                await self.response.aclose()
            except Exception:  # already broken: nothing left to free
                pass
            self._response_closed = True


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


_SHUTDOWN = object()
_END = object()


def _close_unreturned(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is None and isinstance(task.result(), RelayResponse):
        asyncio.ensure_future(task.result().relay.close())


def _relayed_refusal(failure: RemoteFailure) -> Response:
    """A client error from the remote (a 4xx), relayed as it came."""
    media_type = failure.headers.pop("content-type", "application/json")
    return Response(failure.body or b"", status_code=failure.status, media_type=media_type, headers=failure.headers)


def _prompt_estimate(body: dict) -> int:
    what = body.get("messages") or body.get("prompt") or body.get("input") or ""
    return len(json.dumps(what, ensure_ascii=False)) // CHARS_PER_TOKEN


def _usage(response: httpx.Response) -> dict:
    try:
        usage = response.json().get("usage")
    except (ValueError, AttributeError):
        return {}
    return usage if isinstance(usage, dict) else {}

