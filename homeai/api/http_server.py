"""The HTTP/1.1 protocol every server of homeai's app runs under uvicorn: uvicorn's own, with every
byte from the network timed and counted.

    config = http_server.uvicorn_config(app, cfg, log_level="info")   # `homeai serve`, the benchmarks

**The head.** uvicorn waits for a request's line and headers as long as the client likes, so a
client that sends half a head and stops ("slowloris") holds its connection for minutes. Here a
connection waiting for a head gets `server.header_timeout_s`: from the moment it opens, and again
from the end of each answer on a kept-alive connection. A client that has started a head by then
is answered 408 and closed; one that sent nothing is closed.

**The body** is timed as it arrives, whether the app reads it or not (an app that answered before
reading, as auth does from the head, leaves uvicorn dropping the rest unbuffered): its deadline is
`server.body_timeout_s` after its last byte, and at most `body_timeout_s` + bytes so far /
`server.body_min_rate` after its head (Apache's mod_reqtimeout MinRate): past the first
`body_timeout_s`, a body must average `body_min_rate` bytes a second. Each alone falls short: the
rate alone lets a client send all but the last byte of 4 MB at once and then hold its connection
1,000 s; silence alone lets it send a byte every 9 s for ever. A body that misses its deadline is
answered 408 (when no answer has begun) and closed, its request seeing its client leave. While the
server holds the client back, the clock starts again: uvicorn stops reading a connection whose app
has not read the 64 KB that came, and a client that asked may wait for `100 Continue`.

**Connections** are capped in all and per client address, below the open-file limit
(`homeai.api.connections`): one more is closed as it opens. **Memory**: a connection that carried
`TRIM_AFTER_BYTES` of body or more asks, when its answer or itself ends, for the free heap to be
handed back (`homeai.heap`): glibc otherwise keeps what a burst of large bodies freed.

A WebSocket, once upgraded, and an answer however long it streams are not timed here (an idle
kept-alive connection has the head's deadline, uvicorn's `timeout_keep_alive` set to it; a body's
size has its own limit, `homeai.api.limits`). The parser is h11, uvicorn's own when httptools is not installed (homeai
does not install it): h11 says when a head is whole by its client state leaving IDLE, when a body
is coming by SEND_BODY, and comes back to IDLE only once the answer before is complete, so
pipelined and kept-alive requests are timed alike.
"""

from __future__ import annotations

import asyncio
import logging

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from homeai.api.connections import Caps, Counts, limit_accept_errors
from homeai.config import Config, ServerConfig
from homeai.heap import TrimSoon

log = logging.getLogger("homeai.api")

TRIM_AFTER_BYTES = 256 * 1024  # body bytes a connection carried past which its end hands the free heap back
EARLY_S = 0.01  # a body deadline check that fires this close before its deadline counts as on time


def _timeout_response(text: bytes) -> bytes:
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(text), text))


REQUEST_TIMEOUT = _timeout_response(b"the request line and headers did not come in time (server.header_timeout_s)\n")
BODY_TIMEOUT = _timeout_response(b"the request body did not come in time "
                                 b"(server.body_timeout_s, server.body_min_rate)\n")


class BoundedProtocol(H11Protocol):
    """uvicorn's h11 protocol, a head awaited while the client's side is IDLE and a body while it is
    SEND_BODY, each with its deadline (one timer at a time); admitted under the connection caps."""

    server_cfg: ServerConfig = ServerConfig()
    counts: Counts  # this listener's connections by address (`protocol` gives each listener its own)
    trim: TrimSoon

    _timer: asyncio.TimerHandle | None = None
    _timing: str | None = None  # "head" or "body": what the timer waits for
    _head_started = False  # bytes came while the head's deadline ran: the client gets a 408
    _body_start = _body_last = 0.0  # loop times: the body's clock began, its last bytes came
    _body_bytes = 0  # bytes since the body's clock began
    _carried = 0  # body bytes since the free heap was last asked back for this connection
    _address: str | None = None  # counted against the caps while set
    _refused = False
    _upgraded = False

    def connection_made(self, transport) -> None:
        peer = get_remote_addr(transport)
        address = peer[0] if peer else "local"
        if not self.counts.admit(address, len(self.server_state.connections)):
            self._refused = True  # over a cap: closed before a byte is read, and never seen by uvicorn
            transport.close()
            return
        self._address = address
        super().connection_made(transport)
        self._follow_state()

    def connection_lost(self, exc) -> None:
        if self._refused:
            return
        self._stop_timer()
        self._release_address()
        self._trim_if_carried()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._timing == "head":
            self._head_started = True
        elif self._timing == "body":
            self._body_bytes += len(data)
            self._carried += len(data)
            self._body_last = self.loop.time()
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._trim_if_carried()
        self._follow_state()

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._upgraded = True  # the WebSocket's protocol has the connection from here
        self._stop_timer()
        self._release_address()
        super().handle_websocket_upgrade(event)

    # ---- what is timed ------------------------------------------------------------------------

    def _follow_state(self) -> None:
        if self._upgraded or self.transport.is_closing():
            self._stop_timer()
        elif self.conn.their_state is h11.IDLE:
            self._time("head", self.server_cfg.header_timeout_s, self._head_timed_out)
        elif self.conn.their_state is h11.SEND_BODY:
            self._time("body", self.server_cfg.body_timeout_s, self._check_body)
        else:  # a request came whole (its answer is not timed here), or the connection failed
            self._stop_timer()

    def _time(self, what: str, delay_s: float, callback) -> None:
        if self._timing == what:
            return
        self._stop_timer()
        self._timing, self._head_started = what, False
        self._body_start = self._body_last = self.loop.time()
        self._body_bytes = 0
        self._timer = self.loop.call_later(delay_s, callback)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timing = None

    def _head_timed_out(self) -> None:
        self._timer = self._timing = None
        if self.transport.is_closing():
            return
        log.debug("dropped a connection from %s: no whole request head in %g s (server.header_timeout_s)",
                  self._address, self.server_cfg.header_timeout_s)
        if self._head_started:
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()

    def _check_body(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        deadline = self._body_deadline()
        if deadline - self.loop.time() > EARLY_S:
            self._timer = self.loop.call_at(deadline, self._check_body)
            return
        self._timing = None
        log.debug("dropped a connection from %s: its request body came too slowly (%d bytes in %.1f s; "
                  "server.body_timeout_s, server.body_min_rate)", self._address, self._body_bytes,
                  self.loop.time() - self._body_start)
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # no answer has begun: say why
            self.transport.write(BODY_TIMEOUT)
        self.transport.close()

    def _body_deadline(self) -> float:
        """When the body is late: silence of body_timeout_s, or below body_min_rate past its first body_timeout_s.
        While the server holds the client back, its clock starts again."""
        timeout_s, now = self.server_cfg.body_timeout_s, self.loop.time()
        if self.flow.read_paused or self.conn.they_are_waiting_for_100_continue:
            self._body_start = self._body_last = now
            self._body_bytes = 0
        by_rate = self._body_start + timeout_s + self._body_bytes / self.server_cfg.body_min_rate
        return min(self._body_last + timeout_s, by_rate)

    # ---- caps and memory ----------------------------------------------------------------------

    def _release_address(self) -> None:
        if self._address is not None:
            self.counts.release(self._address)
            self._address = None

    def _trim_if_carried(self) -> None:
        if self._carried >= TRIM_AFTER_BYTES:
            self._carried = 0
            self.trim()


def protocol(server: ServerConfig, caps: Caps | None = None) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with `server`'s deadlines, under `caps` (by default `server`'s under this
    process's file limit); each call makes one listener's: its own counts and trim."""
    counts = Counts(caps or Caps.of(server))
    return type(BoundedProtocol.__name__, (BoundedProtocol,),
                {"server_cfg": server, "counts": counts, "trim": TrimSoon(collect=True)})


def uvicorn_config(app, cfg: Config, **options) -> uvicorn.Config:
    """The uvicorn config of a server of `app`: `protocol` with `cfg`'s deadlines and caps, WebSocket
    messages capped at `server.max_ws_message_bytes`, accept errors logged once a minute. `options`
    are uvicorn.Config's others (host and port default to `cfg`'s)."""
    caps = Caps.of(cfg.server)
    if caps.warning() is not None:
        log.warning("%s", caps.warning())
    # An idle kept-alive connection is closed by the head's deadline (`header_timeout_s`), not sooner:
    # uvicorn's own 5 s is the same as the pools of httpx (the `openai` and `ollama` clients, Home
    # Assistant), so the server closed a connection just as a client sent its next request on it, and
    # the client saw "Server disconnected without sending a response".
    options = {"host": cfg.server.host, "port": cfg.server.port, "timeout_keep_alive": cfg.server.header_timeout_s,
               **options}
    config = uvicorn.Config(app, http=protocol(cfg.server, caps), ws_max_size=cfg.server.max_ws_message_bytes,
                            **options)
    limit_accept_errors()  # after uvicorn.Config, which configures logging
    return config
