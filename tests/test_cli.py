"""The `homeai` command as a user runs it: a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys


def homeai(*args, env=None, tmp_path=None):
    full_env = {**os.environ, **(env or {})}
    if tmp_path is not None:
        full_env["XDG_DATA_HOME"] = str(tmp_path)
    return subprocess.run([sys.executable, "-m", "homeai.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def test_doctor_prints_the_facts(tmp_path):
    out = homeai("doctor", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    for label in ("llama.cpp backends", "GPU offload available", "generation model", "SmolLM2",
                  "MB)", "database", "writable", "config file", "(built-in defaults)", "speech model"):
        assert label in out.stdout, label
    assert "CPU" in out.stdout


def test_unknown_config_key_stops_with_a_clear_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nprot = 9000\n")
    out = homeai("--config", str(bad), "doctor")
    assert out.returncode == 2
    assert f"{bad}: unknown key server.prot" in out.stderr
    out = homeai("doctor", env={"HOMEAI_CONFIG": str(bad)})
    assert out.returncode == 2 and "server.prot" in out.stderr
    out = homeai("serve", "--config", str(bad))
    assert out.returncode == 2 and "server.prot" in out.stderr


def test_members_add_list_revoke(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[database]\nurl = \"sqlite:///{tmp_path / 'h.db'}\"\n")
    out = homeai("--config", str(cfg), "members", "add", "alice", "--admin")
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().split()[-1]
    assert token.startswith("hai_")
    listed = homeai("--config", str(cfg), "members", "list").stdout
    assert "alice" in listed and "admin" in listed and token[:12] in listed
    assert homeai("--config", str(cfg), "members", "add", "alice").returncode == 1
    out = homeai("--config", str(cfg), "members", "revoke", "alice")
    assert out.returncode == 0 and "revoked 1" in out.stdout
    assert token[:12] not in homeai("--config", str(cfg), "members", "list").stdout
