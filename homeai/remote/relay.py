"""Relaying a lane's requests to its remote server: admission, the HTTP exchange, the stream relay.

A `RemoteLane` per `[remote.<lane>]`:

* admission first: its `FairGate` (the lane's `max_queue`, then `QueueFull`; `concurrency` in
  flight; the next slot to the member with the fewest virtual tokens), settled with the usage
  the remote reports;
* the client's own JSON body is forwarded (less `lane`, which travels as `X-HomeAI-Lane` so
  another homeai files it in the same lane; `model` replaced when the remote names one);
* a whole answer comes back as the remote's response; a stream as a `Relay`, whose events
  always end with `[DONE]`: a remote that drops or stalls, or a server that stops, ends it with
  a final chunk (`finish_reason` "error" or "abort") and an error event first;
* its failures and fallbacks to the local model are counted for the lanes view.

No FastAPI types here (SSE framing and the error body come from `homeai.wire`): `homeai.api.dispatch`
decides where a route's request goes, and turns what comes back into a response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

import httpx

from homeai.config import Config, RemoteConfig
from homeai.remote.client import RemoteClient, RemoteFailure
from homeai.remote.gate import FairGate, Ticket
from homeai.wire import DONE, error_body, sse

log = logging.getLogger("homeai.remote")

CHARS_PER_TOKEN = 4  # a prompt's token estimate until the remote reports its usage
CLOSE_WAIT_S = 5.0  # relays cut short at shutdown get this long to send their last chunk


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
        self.tasks: set[asyncio.Task] = set()  # requests in progress, cancelled when the server stops
        self.counters = {"failures": 0, "fallbacks": 0}

    def body_for(self, client_body: dict) -> dict:
        """What the remote is sent: the client's body, less `lane`, with the remote's `model`."""
        body = dict(client_body)
        body.pop("lane", None)
        if self.cfg.model:
            body["model"] = self.cfg.model
        return body

    async def send(self, path: str, body: dict, *, member: str, stream: bool) -> "Relay | httpx.Response":
        """Admit, then send: a stream comes back as a `Relay`, a whole answer as the remote's
        response (read, its gate slot released). Raises QueueFull, GateClosed or RemoteFailure."""
        ticket = await self.gate.acquire(member, _prompt_estimate(body))
        try:
            if stream:
                wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
                response = await self.client.open_stream(path, body, self._headers())
                relay = Relay(self, response, ticket, path, wants_usage=wants_usage)
                self.relays.add(relay)
                return relay
            response = await self.client.post(path, body, self._headers())
            usage = _usage(response)
            ticket.settle(num_prompt=usage.get("prompt_tokens"), num_output=usage.get("completion_tokens") or 0)
            ticket.release()
            return response
        except BaseException:
            ticket.release()
            raise

    def falls_back(self, failure: RemoteFailure) -> bool:
        """Count the remote's failure; whether the local model answers instead (`fallback_local`)."""
        self.counters["failures"] += 1
        if not self.cfg.fallback_local:
            return False
        self.counters["fallbacks"] += 1
        log.warning("%s; answering locally (fallback_local)", failure.message)
        return True

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


_SHUTDOWN = object()
_END = object()


def _prompt_estimate(body: dict) -> int:
    what = body.get("messages") or body.get("prompt") or body.get("input") or ""
    return len(json.dumps(what, ensure_ascii=False)) // CHARS_PER_TOKEN


def _usage(response: httpx.Response) -> dict:
    try:
        usage = response.json().get("usage")
    except (ValueError, AttributeError):
        return {}
    return usage if isinstance(usage, dict) else {}
