"""Typed dependencies the routes take: the app's runtime, its engine once loaded, the lane header."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from homeai.api.errors import ApiError
from homeai.api.runtime import Runtime
from homeai.engine.engine import Engine


def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_engine(runtime: RuntimeDep) -> Engine:
    if runtime.engine is None:
        if runtime.error:
            raise ApiError(503, runtime.error, code="model_unavailable")
        raise ApiError(503, "the model is still loading; retry shortly", code="model_loading",
                       headers={"Retry-After": "5"})
    return runtime.engine


EngineDep = Annotated[Engine, Depends(get_engine)]

# `X-HomeAI-Lane: voice` picks the lane when the body has no `lane` field.
LaneHeader = Annotated[str | None, Header(alias="X-HomeAI-Lane")]
