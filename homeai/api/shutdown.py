"""Graceful shutdown: what SIGTERM does to a serving homeai, and `serve`, which runs the app.

systemd stops (or restarts) homeai with SIGTERM; uvicorn ends its main loop and calls
`shutdown`, which `GracefulServer` begins with `Runtime.shutdown`:

1. admission closes: a new HTTP request gets 503 `shutting_down` (with Retry-After; `engine_stopped`
   and why, when the engine died), a new WebSocket is refused;
2. background jobs are told to stop: a running job checkpoints its run as interrupted, and
   the next start resumes it;
3. requests in flight get `server.shutdown_grace_s` to finish by themselves;
4. what is left is cut short: the engine aborts its sequences and remote relays stop, and each
   stream ends cleanly, with a final chunk (`finish_reason` "abort"), an error event saying the
   server is shutting down, and `[DONE]`.

Then uvicorn closes the listening socket and waits for the connections, and the lifespan stops
the engine, writes the queued request statistics and closes the database. The process exits 0.

When the engine dies instead (its loop thread ended by an error: `homeai.engine.engine`),
every request in flight has already ended with an error; the server logs why, goes through
the same stop and exits with `EXIT_ENGINE_DIED`, so that systemd restarts it, rather than
answer `/healthz` while nothing can be served. Should that stop hang, the process exits with
the same status `FATAL_EXIT_S` after the grace period anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from homeai import logs
from homeai.api import http_server
from homeai.api.errors import ApiError, error_response
from homeai.config import Config

log = logging.getLogger("homeai.api")

FINAL_WAIT_S = 5.0  # after the drain, connections get this long to close before uvicorn cancels them
CLOSE_SERVICE_RESTART = 1012  # WebSocket close code: the server is restarting
EXIT_ENGINE_DIED = 70  # EX_SOFTWARE: the engine died; systemd's Restart=on-failure starts homeai again
FATAL_EXIT_S = 30.0  # after the grace period, a stop that hangs after the engine died is cut short


class Admission:
    """Whether new requests are admitted, and how many are in flight."""

    def __init__(self):
        self.draining = False
        self.num_inflight = 0
        self.engine_error: str | None = None  # why the engine died, once it has: said to each refusal

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight, at most `timeout_s`; whether none is."""
        deadline = time.monotonic() + timeout_s
        while self.num_inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self.num_inflight


class AdmissionMiddleware:
    """Counts HTTP requests in flight; once draining, refuses new requests and sockets."""

    def __init__(self, app: ASGIApp, admission: Admission):
        self.app, self.admission = app, admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and self.admission.draining:
            await send({"type": "websocket.close", "code": CLOSE_SERVICE_RESTART, "reason": "shutting down"})
            return
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.admission.draining:
            refusal = _refusal(self.admission)
            return await error_response(refusal)(scope, receive, send)
        self.admission.num_inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.num_inflight -= 1


def _refusal(admission: Admission) -> ApiError:
    """A request's answer while draining: the engine's death when that is why, else the stop."""
    headers = {"Retry-After": "5", "Connection": "close"}
    if admission.engine_error is not None:
        return ApiError(503, admission.engine_error, code="engine_stopped", headers=headers)
    return ApiError(503, "the server is shutting down; retry in a moment", code="shutting_down", headers=headers)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, draining the app's runtime before it closes the connections."""

    def __init__(self, config: uvicorn.Config, app, grace_s: float):
        super().__init__(config)
        self.homeai_app, self.grace_s = app, grace_s
        self.exit_code = 0
        self._deadline: threading.Timer | None = None

    def fatal(self, reason: str) -> None:
        """The engine died (called from its thread): stop serving, and exit `EXIT_ENGINE_DIED`."""
        log.critical("%s; stopping with exit status %d", reason, EXIT_ENGINE_DIED)
        self.exit_code = EXIT_ENGINE_DIED
        self.should_exit = True
        self._deadline = threading.Timer(self.grace_s + FATAL_EXIT_S, _exit_now)
        self._deadline.daemon = True
        self._deadline.start()

    async def shutdown(self, sockets=None) -> None:
        log.info("shutting down: draining requests for up to %g s", self.grace_s)
        state = self.homeai_app.state
        drain = asyncio.ensure_future(state.runtime.shutdown(self.grace_s))
        while not drain.done() and not self.force_exit:  # a second Ctrl-C cuts the drain short
            await asyncio.wait({drain}, timeout=0.1)
        if drain.done() and drain.exception() is not None:  # the rest of the shutdown must still run
            log.error("the graceful drain failed", exc_info=drain.exception())
        await super().shutdown(sockets)
        if self._deadline is not None:  # the stop finished: `serve` returns the exit status itself
            self._deadline.cancel()


def serve(app, cfg: Config, *, log_level: str = "info") -> int:
    """Run `app` on the configured address until SIGTERM or SIGINT (0 after a clean stop), or
    until the engine dies (`EXIT_ENGINE_DIED`)."""
    server = make_server(app, cfg, log_level=log_level)
    with _stop_signals_end_cleanly():
        server.run()
    return server.exit_code or (0 if server.started else 3)


def make_server(app, cfg: Config, *, log_level: str = "info") -> GracefulServer:
    """The server `serve` runs: uvicorn's, draining on SIGTERM, stopping when the engine dies."""
    config = http_server.uvicorn_config(app, cfg, log_level=log_level,  # heads and bodies timed, connections capped
                                        log_config=logs.config(log_level),  # every line with its tokens redacted
                                        timeout_graceful_shutdown=FINAL_WAIT_S)
    server = GracefulServer(config, app, cfg.server.shutdown_grace_s)
    app.state.runtime.on_fatal.append(server.fatal)
    return server


def _exit_now() -> None:
    log.critical("the stop after the engine died did not finish; exiting now")
    sys.stderr.flush()
    os._exit(EXIT_ENGINE_DIED)


@contextlib.contextmanager
def _stop_signals_end_cleanly() -> Iterator[None]:
    # uvicorn handles SIGTERM/SIGINT while serving, then raises the signal again under the handlers
    # it found, to die by it. Finding these no-ops instead, the process returns and exits 0: the
    # drain above already was the clean stop.
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ignore(_signum, _frame) -> None:
    pass
