"""Ollama's model management on homeai's port: `/api/version`, `/api/tags` (the served model, its
lane names `<id>:<lane>` for the lanes the member may use (`homeai.service.names`), and every local
model), `/api/ps` (the served one: the only one loaded), `/api/show` (any of them, a lane name too),
`/api/pull` and `/api/delete` (a local model that is not served; an admin's when auth is on).

`/api/pull` downloads from Hugging Face as `homeai pull` does (`homeai.pull`): the repository's
files chosen first (an unknown repository or quantisation is an error listing what it has, before
anything streams), then Ollama's progress lines (`pulling manifest`, `pulling <digest>` with
`digest`/`total`/`completed`, `verifying sha256 digest`, `writing manifest`, `success`), or one
object with `"stream": false`. A download is an admin's when auth is on (a model that is here
already answers success to any member); one pull from a repository at a time; a
client that leaves cancels its pull (the next pull of the name resumes it). A pull does not change
the model the household is served: that is `model.path` in the config, then a restart.

Errors are Ollama's `{"error": "..."}` (`homeai.api.ollama_route`); the entries themselves are
`homeai.api.ollama_models`'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from homeai import __version__, catalog, pull
from homeai.api import ollama_models
from homeai.api.auth import CurrentMember
from homeai.api.deps import RuntimeDep, ServiceDep
from homeai.api.errors import ApiError
from homeai.api.ollama_models import Listed
from homeai.api.ollama_route import NDJSON, line, ollama_router
from homeai.api.ollama_schemas import ModelRequest
from homeai.gguf_header import context_length, metadata

OLLAMA_VERSION = "0.12.0"  # the Ollama API this answers as: clients gate features (tools, think) on it
POLL_S = 0.5  # how often a whole (unstreamed) pull looks whether its client is still there

log = logging.getLogger("homeai.api")
router = ollama_router()
_pulling: set[str] = set()  # repositories being pulled from by this server (`pull.lock_key`)


@router.get("/version")
def version() -> dict:
    return {"version": OLLAMA_VERSION, "homeai": __version__}


@router.get("/tags")
def tags(runtime: RuntimeDep, service: ServiceDep, member: CurrentMember) -> dict:
    """A plain function: the first call reads the GGUF headers, in a worker thread."""
    served = [Listed.of_card(card) for card in service.cards()]  # a 503 while the model loads
    served += [dataclasses.replace(served[0], name=ollama_models.ollama_name(name))  # the alias as `home:latest`
               for name in service.lane_names(member)]
    local = [Listed.of_local(model) for model in catalog.listed(_models(runtime))
             if not ollama_models.is_projector(str(model.path))]  # (a vision projector is no model to chat with)
    names = {model.name for model in served}  # a hand-placed file served is listed once
    return {"models": [ollama_models.tag_entry(model) for model in served + [m for m in local if m.name not in names]]}


@router.get("/ps")
def ps(service: ServiceDep) -> dict:
    return {"models": [ollama_models.ps_entry(card, context_length=service.context_length(), on_gpu=service.on_gpu())
                       for card in service.cards()]}


@router.post("/show")
def show(body: ModelRequest, runtime: RuntimeDep, service: ServiceDep, member: CurrentMember) -> dict:
    """The model file's path for an admin; its name only for other members."""
    name = body.requested()
    served = ollama_models.served(service, name)
    if served is not None:
        card, purposes = served
        form, choice = service.thinking_form(), service.template_choice()
        chat = "generate" in purposes
        return ollama_models.show(card.path, capabilities=ollama_models.capabilities(purposes, thinks=form.can_think,
                                                                                       vision=service.sees()),
                                  context_length=service.context_length(), full_path=member.is_admin,
                                  chat_template=ollama_models.served_template(choice, form) if chat else None,
                                  template=choice.template.source if chat else None)
    local = catalog.find(_models(runtime), name)
    if local is None:
        raise ApiError(404, ollama_models.not_found(name))
    path = str(local.path)
    return ollama_models.show(path, capabilities=ollama_models.local_capabilities(path),
                              context_length=context_length(metadata(path)) or 0, full_path=member.is_admin)


@router.post("/pull")
async def pull_model(body: ModelRequest, request: Request, runtime: RuntimeDep, service: ServiceDep,
                     member: CurrentMember) -> Response:
    """A model that is here already (served or local) answers success to anyone; a download is an admin's."""
    service.ready()
    name, models = body.requested(), _models(runtime)
    if ollama_models.served(service, name) is not None or catalog.find(models, name) is not None:
        return _answer(body.stream, [{"status": "pulling manifest"}, {"status": "success"}])
    try:
        catalog.parse(name)
    except ValueError as e:
        served = ", ".join(ollama_models.ollama_name(card.id) for card in service.cards_now())
        raise ApiError(404, f"{e} (this server serves {served})") from None
    if runtime.cfg.auth.required and not member.is_admin:
        raise ApiError(403, "only an admin may pull models")
    chosen = await _plan(name)
    key = pull.lock_key(chosen.name)
    if key in _pulling:
        raise ApiError(409, f"{chosen.name} is being pulled already; try again once that pull ends")
    loop, steps, cancel = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()
    _pulling.add(key)
    job = _in_thread(pull.fetch, chosen, models, lambda step: loop.call_soon_threadsafe(steps.put_nowait, step),
                     cancel)
    job.add_done_callback(lambda ended: _ended(key, ended))
    if body.stream:
        return StreamingResponse(_lines(steps, job, cancel), media_type=NDJSON)
    return await _whole(request, job, cancel)


def _ended(key: str, job: asyncio.Future) -> None:
    """The model may be pulled again; a pull whose client left is logged here (no one else reads it)."""
    _pulling.discard(key)
    error = job.exception()
    if isinstance(error, pull.Cancelled):
        log.info("pull of %s cancelled: its client left", key)


@router.delete("/delete")
def delete(body: ModelRequest, runtime: RuntimeDep, service: ServiceDep, member: CurrentMember) -> Response:
    """A local model's files deleted, as `homeai models rm` does: an admin's when auth is on; never the
    model being served (change `model.path` and restart first)."""
    service.ready()
    if runtime.cfg.auth.required and not member.is_admin:
        raise ApiError(403, "only an admin may delete models")
    name, models = body.requested(), _models(runtime)
    local = catalog.find(models, name)
    if local is None:
        raise ApiError(404, ollama_models.not_found(name))
    if any(Path(card.path).resolve() == local.path.resolve() for card in service.cards_now()):
        raise ApiError(400, f"{local.name} is the model being served; serve another (model.path) before deleting it")
    catalog.remove(models, local.name)
    return Response(status_code=200)


async def _plan(name: str) -> pull.Plan:
    try:
        return await asyncio.to_thread(pull.plan, name)
    except pull.PullError as e:
        raise ApiError(e.status, str(e)) from None


async def _lines(steps: asyncio.Queue, job: asyncio.Future, cancel: threading.Event) -> AsyncIterator[str]:
    """The pull's progress as it comes; the pull cancelled when the client leaves (this generator is closed)."""
    step = None
    try:
        yield line({"status": "pulling manifest"})
        while True:
            step = asyncio.ensure_future(steps.get())
            await asyncio.wait({step, job}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                break
            yield line(_ollama(step.result()))
        while not steps.empty():
            yield line(_ollama(steps.get_nowait()))
        if (error := _failure(job)) is not None:
            yield line({"error": error.message})
    finally:
        cancel.set()
        if step is not None:
            step.cancel()


async def _whole(request: Request, job: asyncio.Future, cancel: threading.Event) -> Response:
    """`"stream": false`: one answer once the pull ends; cancelled if the client leaves meanwhile."""
    while not job.done():
        await asyncio.wait({job}, timeout=POLL_S)
        if not job.done() and await request.is_disconnected():
            cancel.set()
    if (error := _failure(job)) is not None:
        raise error
    return JSONResponse({"status": "success"})


def _failure(job: asyncio.Future) -> ApiError | None:
    error = job.exception()
    if error is None:
        return None
    if isinstance(error, pull.PullError):
        return ApiError(error.status, str(error))
    log.error("pull failed", exc_info=error)
    return ApiError(500, f"the pull failed: {type(error).__name__}")


def _in_thread(fn, *args) -> asyncio.Future:
    """`fn(*args)` in a thread of its own (a daemon: a pull never holds the server's exit; its part stays)."""
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting route
            done.set_exception(e)

    threading.Thread(target=run, name="homeai-pull", daemon=True).start()
    return asyncio.wrap_future(done)


def _answer(stream: bool, lines: list[dict]) -> Response:
    if not stream:
        return JSONResponse(lines[-1])
    return Response("".join(line(obj) for obj in lines), media_type=NDJSON)


def _ollama(step: pull.Step) -> dict:
    return {k: v for k, v in dataclasses.asdict(step).items() if v is not None}


def _models(runtime) -> Path:
    return catalog.folder(runtime.cfg.data_dir)

