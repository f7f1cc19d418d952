"""Typed dependencies the routes take: the app's service (`ServiceDep`), its runtime, its engine once
loaded (for routes not yet on the service), the lane header."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from homeai.api.runtime import Runtime
from homeai.engine.engine import Engine
from homeai.service import Service


def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def get_engine(request: Request) -> Engine:
    """The engine once the model is loaded; else a 503 saying why (the service's words)."""
    return get_service(request).engine()


EngineDep = Annotated[Engine, Depends(get_engine)]

# `X-HomeAI-Lane: voice` picks the lane when the body has no `lane` field.
LaneHeader = Annotated[str | None, Header(alias="X-HomeAI-Lane")]
