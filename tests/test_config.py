"""Config: the example file is valid and complete; bad files fail naming the file and the key."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from homeai.config import SECTIONS, Config, ConfigError, RemoteConfig, load, resolve_path, with_overrides

EXAMPLE = Path(__file__).resolve().parents[1] / "config.example.toml"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "homeai.toml"
    path.write_text(text)
    return path


def test_defaults_serve_the_embedded_model_on_loopback(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    cfg = load(None)
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8700)
    assert cfg.model.path == "" and cfg.model.use_extra_bufts is False
    assert cfg.data_dir == tmp_path / "homeai"
    assert cfg.database_url == f"sqlite:///{tmp_path / 'homeai' / 'homeai.db'}"


def test_example_file_loads_and_documents_every_key():
    cfg = load(EXAMPLE)
    assert cfg.source == str(EXAMPLE)
    raw = tomllib.loads(EXAMPLE.read_text())
    for section, cls in SECTIONS.items():
        assert set(raw[section]) == {f.name for f in dataclasses.fields(cls)}, section
    text = EXAMPLE.read_text()
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            line = next(l for l in text.splitlines() if l.startswith(f"{f.name} ="))
            assert "#" in line, f"{section}.{f.name} has no comment"
    assert set(raw["lanes"]) == set(Config().lanes)


@pytest.mark.parametrize("text, message", [
    ("[model]\nn_ctxx = 4096\n", "unknown key model.n_ctxx"),
    ("[modle]\nn_ctx = 4096\n", "unknown section [modle]"),
    ("[model]\nn_ctx = \"big\"\n", "model.n_ctx must be int"),
    ("[model]\nuse_extra_bufts = 1\n", "model.use_extra_bufts must be bool"),
    ("[model]\nn_ctx = 16\n", "model.n_ctx must be at least 256"),
    ("[model]\npath = \"/nowhere/model.gguf\"\n", "model.path names no file"),
    ("[server]\nport = 70000\n", "server.port must be 1-65535"),
    ("[server]\nhost = \"0.0.0.0\"\n", "auth.required may be false only when server.host is a loopback"),
    ("[lanes.karaoke]\nweight = 1.0\n", "unknown lane [lanes.karaoke]"),
    ("[lanes.chat]\nwieght = 1.0\n", "unknown key lanes.chat.wieght"),
    ("[lanes.chat]\nweight = 0\n", "lanes.chat.weight must be positive"),
    ("[scheduler]\nbackground_min_share = 1.5\n", "scheduler.background_min_share must be in [0, 1)"),
    ("[scheduler]\nmember_seq_share = 0\n", "scheduler.member_seq_share must be in (0, 1]"),
    ("[model\n", "not valid TOML"),
    ("[server]\nmax_messages = 0\n", "server.max_messages must be at least 1"),
    ("[server]\nshutdown_grace_s = -1.0\n", "server.shutdown_grace_s must be 0 or more"),
    ("[server]\nallowed_hosts = [\"http://homeai.lan\"]\n", "server.allowed_hosts must hold host names"),
    ("[server]\nallowed_hosts = [\"homeai.lan:8700\"]\n", "server.allowed_hosts must hold host names"),
    ("[server]\nmetrics_public = \"yes\"\n", "server.metrics_public must be bool"),
    ("[server]\nmax_output_tokens = 100\n", "lanes.voice.max_tokens must be 0..server.max_output_tokens (100)"),
    ("[remote.voice]\nurl = \"http://box:8700/v1\"\n", "a remote can serve only the lanes chat, summaries, embeddings"),
    ("[remote.chat]\nurl = \"box:8700\"\n", "remote.chat.url must be an http(s) URL"),
    ("[remote.chat]\nurl = \"http://box/v1\"\nconcurrency = 0\n", "remote.chat.concurrency must be 1-1024"),
    ("[remote.chat]\nurl = \"http://box/v1\"\ntimeout_s = 0\n", "remote.chat.timeout_s must be positive"),
    ("[remote.chat]\nurl = \"http://box/v1\"\nfallback = true\n", "unknown key remote.chat.fallback"),
    ("[remote]\nurl = \"http://box/v1\"\n", "[remote] holds one table per lane"),
    ("[speculative]\nmax_draft = 0\n", "speculative.max_draft must be 1..32, got 0"),
    ("[speculative]\nmax_draft = 64\n", "speculative.max_draft must be 1..32, got 64"),
    ("[speculative]\nlanes = [\"chats\"]\n", "speculative.lanes names no lane: chats"),
    ("[speculative]\nenabled = \"auto\"\n", "speculative.enabled must be bool"),
])
def test_bad_config_names_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_remote_example_is_documented_and_loads_once_uncommented(tmp_path):
    text = EXAMPLE.read_text()
    block = text[text.index("# [remote.summaries]"):]
    lines = [line.removeprefix("# ") for line in block.splitlines() if line.startswith("# ")]
    for f in dataclasses.fields(RemoteConfig):
        line = next(l for l in lines if l.startswith(f"{f.name} ="))
        assert "#" in line, f"remote.{f.name} has no comment"
    cfg = load(write(tmp_path, text + "\n".join(lines) + "\n"))
    assert cfg.remotes["summaries"].url == "http://gpu-box:8700/v1" and not cfg.remotes["summaries"].fallback_local
    assert load(EXAMPLE).remotes == {}  # commented out: the example serves everything locally
    assert "api_key" not in repr(cfg.remotes["summaries"])  # a secret stays out of logs


def test_lane_overrides_keep_the_rest_of_the_policy(tmp_path):
    cfg = load(write(tmp_path, "[lanes.chat]\nmax_queue = 3\n"))
    assert cfg.lanes["chat"].max_queue == 3 and cfg.lanes["chat"].interactive
    assert cfg.lanes["voice"] == Config().lanes["voice"]


def test_config_path_flag_then_environment(monkeypatch):
    monkeypatch.setenv("HOMEAI_CONFIG", "/etc/homeai.toml")
    assert resolve_path("cli.toml") == "cli.toml"
    assert resolve_path(None) == "/etc/homeai.toml"
    monkeypatch.delenv("HOMEAI_CONFIG")
    assert resolve_path(None) is None


def test_public_bind_needs_auth(tmp_path):
    cfg = load(write(tmp_path, "[auth]\nrequired = true\n[server]\nhost = \"0.0.0.0\"\n"))
    assert cfg.server.host == "0.0.0.0"
    with pytest.raises(ConfigError, match="auth.required"):
        with_overrides(load(None), host="192.168.1.5")
