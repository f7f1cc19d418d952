"""The listener lives and dies with the daemon, and a port it cannot have stops the start.

Run: .venv/bin/python -m pytest tests/wyoming/test_lifecycle.py
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from homeai.app import Program
from homeai.wyoming.server import WyomingServer
from tests.wyoming.conftest import serve, transcribe, wyoming_config

pytestmark = [pytest.mark.model, pytest.mark.anyio]


async def test_the_listener_stops_with_the_daemon(module_tmp, runner, stt):
    with serve(wyoming_config(module_tmp), runner, stt) as (_server, port):
        assert await transcribe(port, b"", 16000) == ""
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_port_in_use_stops_the_start_with_a_clear_error(module_tmp):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"wyoming: cannot listen on 127.0.0.1:{port}: .*in use"):
            await WyomingServer(Program(wyoming_config(module_tmp, port=port)).service).start()
