"""The [wyoming] section: loopback by default, a non-loopback bind only with allow_from, caps that hold.

Run: .venv/bin/python -m pytest tests/wyoming/test_config.py
"""

from __future__ import annotations

import pytest

from homeai.config import ConfigError, from_dict


def test_defaults_are_off_and_on_loopback():
    w = from_dict({}).wyoming
    assert (w.enabled, w.host, w.port, w.allow_from) == (False, "127.0.0.1", 10300, ())


def test_a_lan_bind_with_allow_from_loads():
    allow_from = ["192.168.1.20", "10.0.0.0/24"]
    w = from_dict({"wyoming": {"enabled": True, "host": "0.0.0.0", "allow_from": allow_from}}).wyoming
    assert w.allow_from == ("192.168.1.20", "10.0.0.0/24")


@pytest.mark.parametrize("section, message", [
    ({"host": "0.0.0.0"}, "wyoming.allow_from must name the clients allowed"),
    ({"host": "192.168.1.5", "allow_from": []}, "wyoming.allow_from must name the clients allowed"),
    ({"allow_from": ["kitchen"]}, "wyoming.allow_from must hold addresses or networks"),
    ({"allow_from": "10.0.0.0/8"}, "wyoming.allow_from must be"),
    ({"port": 70000}, "wyoming.port must be 0-65535"),
    ({"max_frame_bytes": 10}, "wyoming.max_frame_bytes must be"),
    ({"enable": True}, "unknown key wyoming.enable"),
    ({"max_connections": 0}, "wyoming.max_connections must be at least 1"),
    ({"max_connections": 4, "max_connections_per_address": 5}, "wyoming.max_connections_per_address must be"),
    ({"max_connections_per_address": 0}, "wyoming.max_connections_per_address must be"),
    ({"max_audio_bytes": 0}, "wyoming.max_audio_bytes must be at least 2"),
])
def test_bad_sections_are_refused(section, message):
    with pytest.raises(ConfigError) as error:
        from_dict({"wyoming": section}, "homeai.toml")
    assert message in str(error.value) and "homeai.toml" in str(error.value)
