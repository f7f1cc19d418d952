"""The one way work reaches the engine: off the event loop, and its refusals as ServiceErrors.

Templating and tokenising a prompt and queueing it run in a worker thread, so a large prompt
never holds up the event loop that streams everyone else's tokens. The wait is shielded: a
request cancelled meanwhile (its client left) lets the worker finish, then aborts whatever it
queued. The engine's refusals become the same errors on every protocol: a prompt too long or
invalid, or messages the model's chat template refuses, is a 400, a full queue a 429 with
`Retry-After` from the lane's recent time to first token, a stopped engine a 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from homeai.engine.engine import Engine, EngineStopped, InvalidRequest, QueueFull, RequestStream
from homeai.engine.template import ChatRenderError
from homeai.sched.request import SamplingParams
from homeai.service.errors import ServiceError, from_engine, retry_after

T = TypeVar("T")
REFUSALS = (InvalidRequest, ChatRenderError, QueueFull, EngineStopped)


async def submit(engine: Engine, prompt: Callable[[], str | list[int]], *, lane: str, member: str,
                 params: SamplingParams, prompt_param: str, group: str = "") -> RequestStream:
    """Queue `prompt()` (built in the worker thread) on `lane` for `member` (a user of the proxy
    `group`, if any: `Caller.group`)."""
    loop = asyncio.get_running_loop()
    return await off_loop(
        lambda: engine.submit(prompt(), lane=lane, member=member, params=params, loop=loop, group=group),
        engine=engine, lane=lane, prompt_param=prompt_param)


async def off_loop(call: Callable[[], T], *, engine: Engine | None, lane: str, prompt_param: str) -> T:
    """Run `call`, which queues work on `lane`, in a worker thread. It returns what it queued: a
    stream, a list of streams, or anything with `abort()`, aborted if the request is cancelled
    meanwhile. `prompt_param` names the request field a refused prompt came from."""
    future = asyncio.get_running_loop().run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_abort_result)
        raise
    except REFUSALS as exc:
        raise refusal(exc, engine=engine, lane=lane, prompt_param=prompt_param) from None


def refusal(exc: Exception, *, engine: Engine | None, lane: str, prompt_param: str) -> ServiceError:
    """The error for an engine refusal on `lane`."""
    wait = retry_after(engine.state(), lane) if isinstance(exc, QueueFull) else 1
    return from_engine(exc, prompt_param=prompt_param, retry_after_s=wait)


def _abort_result(future: asyncio.Future) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    result = future.result()
    for queued in result if isinstance(result, list) else [result]:
        queued.abort()
