"""The HTTP/1.1 protocol `homeai serve` runs under uvicorn: uvicorn's own, with a deadline on the request head.

uvicorn waits for a request's line and headers as long as the client likes, so a client that
sends half a head and stops ("slowloris") holds its connection for minutes; a hundred of them
hold a hundred. Here a connection waiting for a head gets `server.header_timeout_s`: from the
moment it opens, and again from the end of each answer on a kept-alive connection. A client
that has started a head by then is answered 408 and closed; one that sent nothing is closed.

Once a head is whole the deadline is off: a request's body, its answer however long it streams,
and a WebSocket after its upgrade are not timed here (the body's size has its own limit,
`homeai.api.limits`, and an idle kept-alive connection uvicorn's `timeout_keep_alive`).

    uvicorn.Config(app, http=http_server.protocol(cfg.server.header_timeout_s), ...)

The parser is h11, uvicorn's own when httptools is not installed (homeai does not install it):
h11 says when a head is whole by its client state leaving IDLE, and comes back to IDLE only
once the answer before is complete, so pipelined and kept-alive requests are timed alike.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("homeai.api")

_TIMED_OUT = b"the request line and headers did not come in time (server.header_timeout_s)\n"
REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                   b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TIMED_OUT), _TIMED_OUT))


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, a head awaited while the client's side of the connection is IDLE:
    h11 leaves IDLE with a whole head (a request, an upgrade) and comes back to it only once the
    answer before is complete."""

    header_timeout_s: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None
    _head_started = False  # bytes came while the deadline ran: the client gets a 408

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._follow_state()

    def connection_lost(self, exc) -> None:
        self._head_complete()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            self._head_started = True
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()

    def _follow_state(self) -> None:
        if self.conn.their_state is h11.IDLE:
            self._await_head()
        else:  # a head came whole, or the connection failed
            self._head_complete()

    def _await_head(self) -> None:
        if self._head_timer is None and not self.transport.is_closing():
            self._head_started = False
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _head_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        log.debug("dropped a connection from %s: no whole request head in %g s (server.header_timeout_s)",
                  self.client[0] if self.client else "unknown", self.header_timeout_s)
        if self._head_started:
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()


def protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a deadline of `header_timeout_s` on each request head."""
    return type(HeadDeadlineProtocol.__name__, (HeadDeadlineProtocol,), {"header_timeout_s": header_timeout_s})
