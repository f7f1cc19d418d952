"""The daemon's FastAPI app: `create_app(program)` builds it over the assembled program
(`homeai.app.Program`); `homeai serve` runs it under uvicorn.

The lifespan opens the program (the store migrated, the default member), starts it (the model
loaded in the background: `/healthz` says "loading" meanwhile; the jobs), and runs the Wyoming
listener when `wyoming.enabled` (`homeai.wyoming`); tests hand in a program over an already loaded
runner. The HTTP side of the app lives in `app.state.runtime` (and the tokens its sockets and
requests hold, watched for revocation, in `app.state.revocations`; the service every protocol
asks, in `app.state.service`; the program, in `app.state.program`), so several apps can share a
process (one at a time over one runner).
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from homeai import __version__
from homeai.api import audio_speech, errors, health, household, jobs, lanes, metrics, transcriptions, voice, web
from homeai.api import ollama as ollama_routes
from homeai.api import ollama_manage
from homeai.api import openai as openai_routes
from homeai.api.auth import HeadAuth
from homeai.api.limits import BodyLimit
from homeai.api.origin import SameSiteMiddleware
from homeai.api.revocation import RevocationMiddleware, Revocations
from homeai.api.runtime import Runtime
from homeai.api.shutdown import AdmissionMiddleware
from homeai.wyoming.server import WyomingServer


def create_app(program) -> FastAPI:
    """The app over `program` (`homeai.app.Program`, not yet opened: the lifespan opens, starts and
    stops it)."""
    cfg = program.cfg

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runtime: Runtime = app.state.runtime
        runtime.open()
        watch = asyncio.create_task(app.state.revocations.watch(runtime.sessions))
        try:
            runtime.start()
            app.state.wyoming = await WyomingServer(program.service).start() if cfg.wyoming.enabled else None
            yield
        finally:
            watch.cancel()
            if getattr(app.state, "wyoming", None) is not None:
                await app.state.wyoming.stop()
            await runtime.shutdown()  # a no-op after SIGTERM's drain
            runtime.stop()

    docs = cfg.server.api_docs  # off by default: Swagger UI and ReDoc load their scripts from a CDN
    app = FastAPI(title="homeai", version=__version__, lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None)
    app.state.program = program
    app.state.runtime = Runtime(program)  # the HTTP side: metrics, the stats writer, the edge's counts
    app.state.service = program.service  # what every protocol asks of the model
    app.state.revocations = Revocations()  # tokens held by open sockets and requests, ended once revoked
    errors.install(app)
    for module in (health, openai_routes, ollama_manage, ollama_routes, lanes, metrics, transcriptions,
                   audio_speech, voice, household, jobs, web):
        app.include_router(module.router)
    app.add_middleware(HeadAuth)  # innermost: a 401 from the head, before any body is read, with CORS's headers
    app.add_middleware(RevocationMiddleware, revocations=app.state.revocations)
    if cfg.server.cors_origins:  # without the middleware, browsers keep to the same origin
        app.add_middleware(CORSMiddleware, allow_origins=list(cfg.server.cors_origins), allow_methods=["*"],
                           allow_headers=["Authorization", "Content-Type", "X-HomeAI-Lane"])
    app.add_middleware(SameSiteMiddleware, server=cfg.server)  # Host names and cross-site writes, auth on or off
    app.add_middleware(BodyLimit, max_bytes=cfg.server.max_body_bytes)
    app.add_middleware(AdmissionMiddleware, admission=app.state.runtime.admission)  # outermost: 503 when stopping
    return app
