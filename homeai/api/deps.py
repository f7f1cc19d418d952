"""Typed dependencies the routes take: the app's service (`ServiceDep`), its runtime, the lane header.
Routes reach the engine only through the service."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from homeai.api.runtime import Runtime
from homeai.service import Service


def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


# `X-HomeAI-Lane: voice` picks the lane when the body has no `lane` field.
LaneHeader = Annotated[str | None, Header(alias="X-HomeAI-Lane")]
