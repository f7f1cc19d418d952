"""The systemd unit: it parses, it verifies (`systemd-analyze verify`, where systemd is installed),
and it says what the issue asks: unprivileged, state in a StateDirectory, restarts on failure,
hardened, GPU devices still reachable, a stop timeout longer than homeai's own drain.

Run: .venv/bin/python -m pytest tests/ops/test_systemd.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from homeai.api.shutdown import FINAL_WAIT_S
from homeai.config import ServerConfig

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "homeai.service"


def parse(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as systemd reads it: sections of keys, each with every value it was given."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], defaultdict(list))
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None and key.strip().isidentifier(), f"line {number}: {raw!r}"
        current[key.strip()].append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit():
    return parse(UNIT.read_text())


def one(unit, section: str, key: str) -> str:
    values = unit[section][key]
    assert len(values) == 1, (key, values)
    return values[0]


def test_runs_homeai_serve_unprivileged_with_its_state_in_a_state_directory(unit):
    assert set(unit) == {"Unit", "Service", "Install"}
    assert one(unit, "Service", "ExecStart").endswith("/bin/homeai serve")
    assert one(unit, "Service", "DynamicUser") == "yes" and "User" not in unit["Service"]
    assert one(unit, "Service", "StateDirectory") == "homeai"
    env = dict(v.split("=", 1) for v in unit["Service"]["Environment"])
    assert env["XDG_DATA_HOME"] + "/homeai" == "/var/lib/homeai"  # data_dir is the StateDirectory
    assert env["HOMEAI_CONFIG"].startswith("/etc/homeai/")
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_restarts_on_failure_but_not_on_a_config_error(unit):
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Service", "RestartPreventExitStatus") == "2"  # `homeai serve` exits 2 on a config error


def test_stops_with_sigterm_and_waits_longer_than_the_drain(unit):
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert one(unit, "Service", "KillMode") == "mixed"
    drain = ServerConfig().shutdown_grace_s + FINAL_WAIT_S
    assert float(one(unit, "Service", "TimeoutStopSec")) >= drain + 10


def test_hardened_and_gpu_devices_still_reachable(unit):
    service = unit["Service"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelTunables", "ProtectKernelModules",
                "ProtectControlGroups", "RestrictNamespaces", "RestrictSUIDSGID", "LockPersonality"):
        assert one(unit, "Service", key) == "yes", key
    assert one(unit, "Service", "ProtectSystem") == "strict"
    # AF_NETLINK: getifaddrs, for the addresses wyoming.zeroconf advertises at
    assert set(one(unit, "Service", "RestrictAddressFamilies").split()) == {"AF_INET", "AF_INET6", "AF_UNIX",
                                                                             "AF_NETLINK"}
    assert one(unit, "Service", "CapabilityBoundingSet") == "" and one(unit, "Service", "AmbientCapabilities") == ""
    # GPU: device nodes visible, the groups that own them joined, no device allow-list.
    for key in ("PrivateDevices", "DeviceAllow", "DevicePolicy", "ProtectClock", "PrivateUsers"):
        assert key not in service, key
    assert {"video", "render"} <= set(one(unit, "Service", "SupplementaryGroups").split())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_finds_nothing(tmp_path):
    # verify checks that ExecStart's binary exists: point it at this checkout's homeai.
    homeai = Path(sys.executable).with_name("homeai")
    assert homeai.exists()
    copy = tmp_path / "homeai.service"
    copy.write_text(UNIT.read_text().replace("/opt/homeai/.venv/bin/homeai", str(homeai)))
    out = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert not out.stderr.strip(), out.stderr  # unknown keys and bad values are only warnings: none allowed
