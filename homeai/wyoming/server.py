"""The Wyoming listener: a TCP server beside the HTTP API, started and stopped with the daemon.

    server = await WyomingServer(service).start()   # the app's lifespan, when wyoming.enabled
    ...
    await server.stop()                             # closes the listener and every connection

Wyoming has no authentication, so who may connect is decided here by address alone: with
`wyoming.allow_from` set, a client outside it is closed at connect and logged (its address,
nothing else). The config refuses a non-loopback `wyoming.host` without `allow_from`.
Open connections are capped, `wyoming.max_connections` in all and
`wyoming.max_connections_per_address` from one address: one more gets an `error` event
(`too_many_connections`) and is closed, the refusals logged once a minute at most.
Each accepted connection is one `homeai.wyoming.session.Session`. A connection's audio is
freed when it closes, and the process's free heap handed back to the system soon after:
glibc keeps freed buffers of a few MB otherwise (100 connections of 29 s of 48 kHz audio left
RSS 380 MB higher once they had all closed; `scripts/wyoming_memory.py` measures it).
With `wyoming.zeroconf` the listener is advertised for Home Assistant's discovery while it
listens (`homeai.wyoming.advertise`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import time
from collections import Counter

from homeai.heap import TrimSoon
from homeai.wyoming.advertise import Advertisement
from homeai.wyoming.framing import Event, encode
from homeai.wyoming.session import Session

log = logging.getLogger("homeai.wyoming")

CLOSE_TIMEOUT_S = 5.0  # how long closing one connection may wait for the client's side
REFUSAL_LOG_S = 60.0  # refused connections are logged once in this long, with their count
LINGER_S = 2.0  # a refused connection's input is read and dropped this long at most, before it is closed


class WyomingServer:
    def __init__(self, service):
        self.service = service  # the only thing below Wyoming it is handed (homeai.service)
        self.cfg = service.cfg.wyoming
        self.allowed = [ipaddress.ip_network(entry, strict=False) for entry in self.cfg.allow_from]
        self.port: int | None = None  # the port listened on (wyoming.port, or the one picked for 0)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self._per_address: Counter[str] = Counter()  # sessions open, by client address
        self._refused = RefusalLog()
        self._lingering = 0  # refused connections being closed
        self._trim_soon = TrimSoon()  # after a connection closes, the free heap is handed back (homeai.heap)
        self.advertisement: Advertisement | None = None

    async def start(self) -> WyomingServer:
        host, port = self.cfg.host, self.cfg.port
        try:  # the stream limit bounds a header line: a longer one is a frame_too_large error
            self._server = await asyncio.start_server(self._serve, host, port, limit=self.cfg.max_frame_bytes)
        except OSError as e:
            reason = os.strerror(e.errno) if e.errno else str(e)
            raise OSError(e.errno, f"wyoming: cannot listen on {host}:{port}: {reason} "
                          "(wyoming.host, wyoming.port)") from e
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("wyoming speech to text and text to speech on %s:%d", host, self.port)
        if self.cfg.zeroconf:
            self.advertisement = await Advertisement.start(self.cfg, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening and end the connections still open (a transcription in flight finishes on its pool)."""
        if self._server is None:
            return
        if self.advertisement is not None:
            await self.advertisement.stop()
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._trim_soon.cancel()

    def allows(self, address: str) -> bool:
        if not self.allowed:
            return True
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope id is not part of the address
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # an IPv4 client of a dual-stack listener
        return any(ip in network for network in self.allowed)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else "unknown"
        try:
            if not self.allows(address):
                log.warning("wyoming: refused a connection from %s (not in wyoming.allow_from)", address)
                return
            refusal = self._over_cap(address)
            if refusal is not None:
                self._refused.note(address, refusal)
                await self._refuse(refusal, reader, writer)
                return
            await self._session(address, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left
        except Exception:
            log.exception("wyoming connection from %s failed", address)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)

    def _over_cap(self, address: str) -> str | None:
        """Why one more connection from `address` is refused; None when it is not."""
        if self._per_address.total() >= self.cfg.max_connections:
            return (f"the server has {self.cfg.max_connections} connections open, its limit "
                    "(wyoming.max_connections); retry later")
        if self._per_address[address] >= self.cfg.max_connections_per_address:
            return (f"{self.cfg.max_connections_per_address} connections from {address} are open, the limit "
                    "(wyoming.max_connections_per_address); retry later")
        return None

    async def _refuse(self, reason: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The error event, then what the client sent read and dropped until it closes (LINGER_S at
        most): closed with unread input, the socket would be reset, and the event lost with it.
        At most max_connections refusals linger at once; beyond, they are closed at once."""
        writer.write(encode(Event("error", {"text": reason, "code": "too_many_connections"})))
        await self._linger(reader, writer)

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Before a connection the server ends is closed: what the client still sends (the rest of an
        utterance) read and dropped until it closes, LINGER_S at most, at most max_connections at once."""
        if self._lingering >= self.cfg.max_connections:
            return
        self._lingering += 1
        try:
            writer.write_eof()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_drop_input(reader), LINGER_S)
        finally:
            self._lingering -= 1

    async def _session(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._per_address[address] += 1
        try:
            if await Session(self.service, reader, writer).run():  # ended by an error it told the client
                await self._linger(reader, writer)
        finally:
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]
            self._trim_soon()


async def _drop_input(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


class RefusalLog:
    """Connections refused for the caps, logged once per `REFUSAL_LOG_S` with how many there were."""

    def __init__(self):
        self.count = 0
        self.last = -REFUSAL_LOG_S

    def note(self, address: str, reason: str) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= REFUSAL_LOG_S:
            log.warning("wyoming: refused %d connection(s), the last from %s: %s", self.count, address, reason)
            self.count, self.last = 0, now
