"""The HTTP side of one app, given the assembled program (`homeai.app.Program`): metrics, the stats
writer, the lanes served by remote servers, and what the HTTP edge counts.

`open()` opens the program (the store, the default member, the jobs) and starts the stats writer;
`start()` starts the program (the models load in the background, so `/healthz` can answer
"loading" meanwhile); `stop()` stops the program, and the stats writer once the engine has. The
runtime keeps the admission state that shutdown closes, the
per-member count of open voice sockets (`websockets`), and the per-address count of those still
waiting for a token (`unauthenticated`). One `Runtime` per app, kept in `app.state.runtime`.

`shutdown()` is the graceful stop before `stop()` (SIGTERM: `homeai.api.shutdown` says what it
does). When the engine dies the program's `on_fatal` callbacks are called: this one closes
admission with the reason, and `homeai.api.shutdown.serve` adds one that stops the server with a
non-zero exit status.
"""

from __future__ import annotations

import logging

from homeai.api.limits import PerMember
from homeai.api.prometheus import Metrics
from homeai.api.recorder import StatsRecorder
from homeai.api.shutdown import Admission

log = logging.getLogger("homeai.api")


class Runtime:
    def __init__(self, program):
        self.program = program  # homeai.app.Program: the store, the service and the jobs
        self.cfg = program.cfg
        self.service = program.service
        self.metrics = Metrics(self.cfg.lanes, self.service.state_now)
        self.recorder: StatsRecorder | None = None
        self.remotes = program.remotes  # lanes answered by remote servers ([remote.<lane>])
        self.admission = Admission()  # closed by `shutdown`: new requests get 503
        self.websockets = PerMember(self.cfg.server.max_websockets_per_member)  # open voice sockets per member
        self.unauthenticated = PerMember(  # voice sockets still waiting for a token, per client address
            self.cfg.server.max_unauthenticated_websockets_per_address, "unauthenticated voice sockets",
            "server.max_unauthenticated_websockets_per_address")
        program.on_finish.append(self.metrics.observe)
        program.on_fatal.append(self._engine_died)

    @property
    def sessions(self):
        """The store's sessions (members, tokens, conversations), once `open()` has run."""
        return self.program.sessions

    @property
    def error(self) -> str | None:
        return self.program.error

    @property
    def on_fatal(self) -> list:
        return self.program.on_fatal

    # ---- lifecycle -------------------------------------------------------------

    def open(self) -> None:
        self.program.open()
        self.recorder = StatsRecorder(self.program.sessions).start()
        self.program.on_finish.append(self.recorder.put)
        self.program.on_stop.append(self.recorder.stop)

    def start(self) -> None:
        self.program.start()

    def _engine_died(self, reason: str) -> None:
        self.admission.engine_error = reason

    async def shutdown(self, grace_s: float = 0.0) -> None:
        """The graceful stop (SIGTERM, see `homeai.api.shutdown`): admit nothing more, tell the jobs
        to stop, give requests in flight `grace_s`, then cut the rest short. Once."""
        if self.admission.draining:
            return
        self.admission.draining = True
        stopping_jobs = self.program.stopping_jobs()
        if not await self.admission.wait_idle(grace_s):
            log.info("cutting short %d request(s) still in flight", self.admission.num_inflight)
        await self.program.stop_engine()
        await self.remotes.close()
        if stopping_jobs is not None:
            await stopping_jobs

    def stop(self) -> None:
        self.program.stop()  # the stats writer stops once the engine has (`on_stop`)
