"""`GET /healthz`: 503 `{"status": "loading"}` until the model is loaded, then 200 with what is served."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from homeai.api.deps import ServiceDep

router = APIRouter(tags=["health"])


@router.get("/healthz", responses={503: {"description": "Loading, failed to load, or shutting down"}})
def healthz(service: ServiceDep) -> JSONResponse:
    health = service.health()
    if health["status"] == "error":
        return JSONResponse(health, status_code=503)
    if health["status"] == "loading":
        return JSONResponse(health, status_code=503, headers={"Retry-After": "5"})
    return JSONResponse({**health, "auth_required": service.cfg.auth.required})
