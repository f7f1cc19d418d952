"""The Wyoming listener: a TCP server beside the HTTP API, started and stopped with the daemon.

    server = await WyomingServer(runtime).start()   # the app's lifespan, when wyoming.enabled
    ...
    await server.stop()                             # closes the listener and every connection

Wyoming has no authentication, so who may connect is decided here by address alone: with
`wyoming.allow_from` set, a client outside it is closed at connect and logged (its address,
nothing else). The config refuses a non-loopback `wyoming.host` without `allow_from`.
Each accepted connection is one `homeai.wyoming.session.Session`. With `wyoming.zeroconf` the
listener is advertised for Home Assistant's discovery while it listens (`homeai.wyoming.advertise`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os

from homeai.wyoming.advertise import Advertisement
from homeai.wyoming.session import Session, describe

log = logging.getLogger("homeai.wyoming")

CLOSE_TIMEOUT_S = 5.0  # how long closing one connection may wait for the client's side


class WyomingServer:
    def __init__(self, runtime):
        self.runtime = runtime
        self.cfg = runtime.cfg.wyoming
        self.allowed = [ipaddress.ip_network(entry, strict=False) for entry in self.cfg.allow_from]
        self.info = describe(runtime.cfg)
        self.port: int | None = None  # the port listened on (wyoming.port, or the one picked for 0)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()
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
        log.info("wyoming speech to text on %s:%d", host, self.port)
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
            await Session(self.runtime, self.info, reader, writer).run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left
        except Exception:
            log.exception("wyoming connection from %s failed", address)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
