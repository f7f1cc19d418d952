"""Ollama's model management on homeai's port: `/api/version`, `/api/tags`, `/api/ps`, `/api/show`
and `/api/pull` (the served model answers success, nothing is downloaded).

Errors are Ollama's `{"error": "..."}` (`homeai.api.ollama_route`); the entries themselves are
`homeai.api.ollama_models`'.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response

from homeai import __version__
from homeai.api import ollama_models
from homeai.api.auth import CurrentMember
from homeai.api.deps import EngineDep, RuntimeDep
from homeai.api.errors import ApiError
from homeai.api.ollama_route import NDJSON, line, ollama_router
from homeai.api.ollama_schemas import ModelRequest
from homeai.engine.engine import Engine

OLLAMA_VERSION = "0.12.0"  # the Ollama API this answers as: clients gate features (tools, think) on it

router = ollama_router()


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
    name = body.requested()
    served = ollama_models.served(runtime, name)
    if served is None:
        raise ApiError(404, ollama_models.not_found(name))
    card, purposes = served
    return ollama_models.show(card, capabilities=ollama_models.capabilities(purposes),
                              context_length=_context_length(engine), full_path=member.is_admin)


@router.post("/pull")
def pull(body: ModelRequest, runtime: RuntimeDep, _engine: EngineDep) -> Response:
    """The served model is there already: success, and nothing downloaded. Any other name is an error."""
    name = body.requested()
    if ollama_models.served(runtime, name) is None:
        served = ", ".join(ollama_models.ollama_name(c.id) for c in runtime.cards())
        raise ApiError(404, f'model "{name}" is not served here and homeai downloads no models (it serves {served})')
    if not body.stream:
        return JSONResponse({"status": "success"})
    return Response("".join(line({"status": s}) for s in ("pulling manifest", "success")), media_type=NDJSON)


def _context_length(engine: Engine) -> int:
    return engine.max_seq_len_for("chat") if "chat" in engine.policies else engine.max_seq_len
