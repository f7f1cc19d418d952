"""Zeroconf advertisement of the Wyoming listener, so Home Assistant discovers it (`wyoming.zeroconf`).

    advert = await Advertisement.start(cfg.wyoming, port)   # None when it cannot be made
    ...
    await advert.stop()                                      # says goodbye: the entry leaves at once

The service is `_wyoming._tcp.local.`, as `wyoming-faster-whisper` announces it; Home Assistant's
Wyoming integration lists such services under its discovered devices. The addresses are the one
the listener is bound to, or for a wildcard bind every non-loopback address of this machine's
interfaces. The config refuses advertising a loopback listener: nobody on the LAN could reach it.
Discovery is a convenience: a machine without multicast logs a warning and the listener serves on.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket

import ifaddr
from zeroconf import ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

log = logging.getLogger("homeai.wyoming")

SERVICE_TYPE = "_wyoming._tcp.local."
WILDCARDS = ("", "0.0.0.0", "::")


class Advertisement:
    def __init__(self, zeroconf: AsyncZeroconf, info: ServiceInfo):
        self.zeroconf = zeroconf
        self.info = info

    @classmethod
    async def start(cls, cfg, port: int) -> Advertisement | None:
        zeroconf = None
        try:
            addresses = advertised_addresses(cfg.host)
            if not addresses:
                log.warning("wyoming: no address to advertise for host %r: zeroconf discovery is off", cfg.host)
                return None
            host = _label(socket.gethostname()) or "homeai"
            info = ServiceInfo(SERVICE_TYPE, f"{cfg.zeroconf_name}.{SERVICE_TYPE}", port=port,
                               parsed_addresses=[str(a) for a in addresses], server=f"{host}.local.")
            zeroconf = AsyncZeroconf()
            await zeroconf.async_register_service(info, allow_name_change=True)
        except Exception as e:  # no interface list, no multicast route, a name taken, ...
            log.warning("wyoming: zeroconf advertisement failed (%s); the listener serves on", e)
            if zeroconf is not None:
                await zeroconf.async_close()
            return None
        log.info("wyoming: advertised as %s on %s", info.name, ", ".join(str(a) for a in addresses))
        return cls(zeroconf, info)

    async def stop(self) -> None:
        try:
            await self.zeroconf.async_unregister_service(self.info)
        finally:
            await self.zeroconf.async_close()


def advertised_addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses a client on the LAN reaches the listener at."""
    if host in WILDCARDS:
        found = []
        for adapter in ifaddr.get_adapters():
            for ip in adapter.ips:
                address = ipaddress.ip_address(ip.ip if isinstance(ip.ip, str) else ip.ip[0])
                if host == "0.0.0.0" and address.version != 4:
                    continue
                if not (address.is_loopback or address.is_link_local):
                    found.append(address)
        return found
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    resolved = {ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos}
    return sorted((a for a in resolved if not a.is_loopback), key=lambda a: (a.version, a))


def _label(name: str) -> str:
    """A DNS label from a free-form name: letters, digits, '-', at most 63 bytes."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", name).strip("-")[:63]
