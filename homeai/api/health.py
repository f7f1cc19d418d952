"""`GET /healthz`: 503 `{"status": "loading"}` until the model is loaded, then 200 with what is served."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from homeai.api.deps import RuntimeDep

router = APIRouter(tags=["health"])


@router.get("/healthz", responses={503: {"description": "Loading, failed to load, or shutting down"}})
def healthz(runtime: RuntimeDep) -> JSONResponse:
    if runtime.error:
        return JSONResponse({"status": "error", "error": runtime.error}, status_code=503)
    engine = runtime.engine
    if engine is None:
        return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "5"})
    info = engine.runner.info
    return JSONResponse({
        "status": "ok", "model": runtime.model_id("generate"), "embedding_model": runtime.model_id("embed"),
        "n_ctx": info.n_ctx, "max_seq_len": info.max_seq_len,
        "interactive_max_seq_len": engine.interactive_max_seq_len, "n_seq_max": info.n_seq_max,
        "gpu_offload": info.gpu_offload, "lanes": list(engine.policies),
        "auth_required": runtime.cfg.auth.required,
    })
