"""Home Assistant finds the Wyoming listener by zeroconf: `_wyoming._tcp.local.` is answered with
an address and port where the `wyoming` client's `describe` works, and the entry leaves when the
daemon stops. Browsed with the `zeroconf` package, over this machine's own multicast.

Run: .venv/bin/python -m pytest tests/wyoming/test_zeroconf.py
"""

from __future__ import annotations

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from zeroconf import ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

from homeai.config import ConfigError
from homeai.wyoming.advertise import SERVICE_TYPE, advertised_addresses
from tests.wyoming.conftest import read, serve, wyoming_config

pytestmark = [pytest.mark.model, pytest.mark.anyio]

NAME = "homeai zeroconf test"


async def lookup(name: str, timeout_ms: int) -> ServiceInfo | None:
    zeroconf = AsyncZeroconf()
    try:
        return await zeroconf.async_get_service_info(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", timeout_ms)
    finally:
        await zeroconf.async_close()


async def test_the_listener_is_discovered_then_leaves_with_the_daemon(module_tmp, runner, stt):
    if not advertised_addresses("0.0.0.0"):
        pytest.skip("this machine has no non-loopback IPv4 address to advertise")
    cfg = wyoming_config(module_tmp, host="0.0.0.0", allow_from=["0.0.0.0/0"], zeroconf=True, zeroconf_name=NAME)
    with serve(cfg, runner, stt) as (_server, port):
        found = await lookup(NAME, 3000)
        assert found is not None and found.port == port
        assert found.parsed_addresses() and "127.0.0.1" not in found.parsed_addresses()
        async with AsyncTcpClient(found.parsed_addresses()[0], found.port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await read(client))
        assert info.asr and info.asr[0].installed
    assert await lookup(NAME, 1500) is None  # a goodbye was sent: no stale entry


def test_a_loopback_listener_is_not_advertised(module_tmp):
    with pytest.raises(ConfigError, match="wyoming.zeroconf"):
        wyoming_config(module_tmp, zeroconf=True)
    with pytest.raises(ConfigError, match="wyoming.zeroconf_name"):
        wyoming_config(module_tmp, host="0.0.0.0", allow_from=["10.0.0.0/8"], zeroconf=True, zeroconf_name="a.b")


def test_addresses_for_a_bind():
    assert advertised_addresses("127.0.0.1") == []
    assert [str(a) for a in advertised_addresses("192.0.2.7")] == ["192.0.2.7"]
    assert all(a.version == 4 and not a.is_loopback for a in advertised_addresses("0.0.0.0"))
    assert advertised_addresses("no-such-host.invalid") == []
