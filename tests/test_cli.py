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


def listed_lanes(cfg, name: str) -> str:
    """The `lanes:` field of `name`'s line in `homeai members list`."""
    line = next(line for line in homeai("--config", str(cfg), "members", "list").stdout.splitlines()
                if line.split()[0] == name)
    return line.split("lanes: ")[1].split()[0]


def test_members_lanes_are_set_at_add_shown_and_changed(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[database]\nurl = \"sqlite:///{tmp_path / 'h.db'}\"\n")

    def run(*args):
        return homeai("--config", str(cfg), "members", *args)

    assert run("add", "bob").returncode == 0
    assert run("add", "ha", "--lane", "voice").returncode == 0  # a voice default lane brings voice
    out = run("add", "kid", "--lanes", "chat,embeddings")
    assert out.returncode == 0 and "lanes: chat,embeddings" in out.stdout, out
    assert run("add", "root", "--admin").returncode == 0
    assert listed_lanes(cfg, "bob") == "chat,summaries,indexing,embeddings"
    assert listed_lanes(cfg, "ha") == "voice,chat,summaries,indexing,embeddings"
    assert listed_lanes(cfg, "kid") == "chat,embeddings"
    assert listed_lanes(cfg, "root") == "all"

    out = run("lanes", "bob", "chat,voice")
    assert out.returncode == 0 and "bob may use: voice,chat" in out.stdout, out
    assert listed_lanes(cfg, "bob") == "voice,chat"
    out = run("lanes", "bob", "chat,nowhere")
    assert out.returncode == 1 and "unknown lane 'nowhere'" in out.stderr, out
    out = run("lane", "kid", "voice")  # a default lane the member may not use is refused
    assert out.returncode == 1 and "may not use lane 'voice'" in out.stderr and "chat, embeddings" in out.stderr
    out = run("add", "eve", "--lane", "voice", "--lanes", "chat")
    assert out.returncode == 1 and "may not use lane 'voice'" in out.stderr, out
    out = run("lanes", "ha", "chat")  # ha's default lane is voice: clear or change it first
    assert out.returncode == 1 and "default lane 'voice'" in out.stderr, out
    out = run("lanes", "root", "chat")
    assert out.returncode == 1 and "admin" in out.stderr, out
    assert "eve" not in homeai("--config", str(cfg), "members", "list").stdout


def test_members_proxy_is_set_at_add_shown_and_changed(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[database]\nurl = \"sqlite:///{tmp_path / 'h.db'}\"\n")

    def run(*args):
        return homeai("--config", str(cfg), "members", *args)

    def flags() -> dict:
        return {line.split()[0]: line.split()[2] == "proxy" for line in run("list").stdout.splitlines()}

    out = run("add", "owui", "--proxy")
    assert out.returncode == 0 and "(member, proxy, lanes: chat,summaries,indexing,embeddings)" in out.stdout, out
    assert run("add", "bob").returncode == 0
    assert flags() == {"bob": False, "owui": True}
    out = run("proxy", "bob")
    assert out.returncode == 0 and "X-OpenWebUI-User-Id" in out.stdout, out
    assert run("proxy", "owui", "--off").returncode == 0
    assert flags() == {"bob": True, "owui": False}
    assert run("proxy", "nobody").returncode == 1
