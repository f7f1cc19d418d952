"""Who may connect: a client outside wyoming.allow_from is closed at connect, and logged by address.

The listener is on loopback with an allow_from that leaves loopback out, so the test's own
connections are the disallowed ones.

Run: .venv/bin/python -m pytest tests/wyoming/test_access.py
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe

from tests.wyoming.conftest import read, serve, wyoming_config

pytestmark = [pytest.mark.model, pytest.mark.anyio]


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return wyoming_config(module_tmp, allow_from=["192.168.1.0/24", "fd00::/8"])


@pytest.fixture(scope="module")
def started(cfg, runner, stt):
    with serve(cfg, runner, stt) as running:
        yield running


async def test_a_client_outside_allow_from_is_closed_and_logged(started, caplog):
    _server, port = started
    caplog.set_level(logging.WARNING, logger="homeai.wyoming")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await asyncio.wait_for(reader.read(), 30) == b""  # closed before it said anything
    finally:
        writer.close()
    refused = [r.getMessage() for r in caplog.records if r.name == "homeai.wyoming"]
    assert any("refused a connection from 127.0.0.1" in message for message in refused), refused


async def test_a_describe_from_outside_allow_from_gets_no_answer(started):
    _server, port = started
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    try:
        await client.write_event(Describe().event())
        event = await read(client)
    except ConnectionError:
        event = None  # the server had already closed: the write itself failed
    finally:
        with contextlib.suppress(ConnectionError):
            await client.disconnect()
    assert event is None
