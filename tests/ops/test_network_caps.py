"""The HTTP listener's connection caps and its accept-error log (`homeai.api.connections`), without a
server: the caps derived from the open-file limit, what `homeai doctor` says of them, and the filter
that lets one of asyncio's accept errors through a minute.

Run: .venv/bin/python -m pytest tests/ops/test_network_caps.py
"""

from __future__ import annotations

import logging

import pytest

from homeai.api.connections import (ACCEPT_LOG_S, CEILING, RESERVE_MIN, AcceptErrors, Caps, Counts,
                                    derived_max_connections)
from homeai.config import ConfigError, ServerConfig, from_dict


@pytest.mark.parametrize("limit, cap", [(1024, 768), (8192, CEILING), (512, 256), (300, 300 - RESERVE_MIN)])
def test_the_derived_cap_keeps_a_quarter_of_the_file_limit_at_least_the_reserve(limit, cap):
    assert derived_max_connections(limit) == cap
    assert Caps.of(ServerConfig(), limit).warning() is None


def test_caps_at_or_above_the_file_limit_are_warned_of():
    assert "server.max_connections (8192)" in Caps.of(ServerConfig(max_connections=8192), 8192).warning()
    assert "open-file limit (200)" in Caps.of(ServerConfig(), 200).warning()  # derived, but no room left
    assert Caps.of(ServerConfig(max_connections=100), 8192).describe() == (
        "100 in all (server.max_connections), 64 per client address, under an open-file limit of 8192")


def test_counts_refuse_over_either_cap_and_release_what_closed():
    counts = Counts(Caps(max_connections=3, max_per_address=2, file_limit=1024, derived=False))
    assert counts.admit("10.0.0.2", 0) and counts.admit("10.0.0.2", 1)
    assert not counts.admit("10.0.0.2", 2)  # the address's cap
    assert counts.admit("10.0.0.3", 2)
    assert not counts.admit("10.0.0.4", 3)  # the total's
    counts.release("10.0.0.2")
    assert counts.admit("10.0.0.2", 2) and counts.by_address == {"10.0.0.2": 2, "10.0.0.3": 1}


@pytest.mark.parametrize("server, key", [({"max_connections_per_address": 0}, "max_connections_per_address"),
                                         ({"max_connections": 10, "max_connections_per_address": 11},
                                          "max_connections_per_address"),
                                         ({"max_connections": -1}, "max_connections"),
                                         ({"body_timeout_s": 0}, "body_timeout_s"),
                                         ({"body_min_rate": 0}, "body_min_rate")])
def test_impossible_network_settings_are_refused_naming_the_key(server, key):
    with pytest.raises(ConfigError, match=f"server.{key}"):
        from_dict({"server": server}, "(tests)")


def accept_error() -> logging.LogRecord:
    """asyncio's record, as its default exception handler writes it."""
    error = OSError(24, "Too many open files")
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "socket.accept() out of system resource\n"
                             "socket: <asyncio.TransportSocket fd=7>", None, (OSError, error, None))


def test_one_accept_error_a_minute_gets_through_with_the_count_held_back():
    errors = AcceptErrors()
    assert [errors.filter(accept_error()) for _ in range(1000)].count(True) == 1
    other = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Task exception was never retrieved", None, None)
    assert errors.filter(other)  # other lines pass untouched
    errors.last -= ACCEPT_LOG_S  # a minute later
    record = accept_error()
    assert errors.filter(record)
    assert "999 more such lines" in record.getMessage()
