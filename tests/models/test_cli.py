"""`homeai pull` and `homeai models` as a user runs them: a real process, `HF_ENDPOINT` at the hub stand-in,
the data directory from `XDG_DATA_HOME`; Ctrl-C and a resumed pull; `model.path` naming a local model.

Run: .venv/bin/python -m pytest tests/models/test_cli.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from homeai import catalog
from homeai.config import load
from homeai.models import generation_model
from tests.models.conftest import TINY

NAME = f"hf.co/{TINY}:Q8_0"


@pytest.fixture
def env(hub, tmp_path):
    return {**os.environ, "HF_ENDPOINT": hub.url, "XDG_DATA_HOME": str(tmp_path / "data"), "HOMEAI_CONFIG": "",
            "HF_TOKEN": "", "HF_HOME": str(tmp_path / "hf-home")}


def homeai(env, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "homeai.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_pull_list_serve_by_name_and_remove(env, tmp_path, tiny_gguf, monkeypatch):
    pulled = homeai(env, "pull", f"{TINY}:q8_0")
    assert pulled.returncode == 0, pulled.stderr
    assert f"pulled {NAME}" in pulled.stdout and f'set model.path = "{NAME}"' in pulled.stdout
    listed = homeai(env, "models")
    assert listed.returncode == 0
    row, = [line for line in listed.stdout.splitlines() if line.startswith(NAME)]
    assert "Q8_0" in row and " 8192 " in row and "tiny-Q8_0.gguf" in row
    served = [line for line in listed.stdout.splitlines() if line.split()[-2:-1] == ["yes"]]
    assert served and not served[0].startswith(NAME)  # the embedded model is served, not the pulled one

    config = tmp_path / "homeai.toml"
    config.write_text(f'[model]\npath = "{NAME.lower()}"\n')
    listed = homeai(env, "--config", str(config), "models")
    row, = [line for line in listed.stdout.splitlines() if line.startswith(NAME)]
    assert " yes " in row
    monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])
    cfg = load(config)
    assert generation_model(cfg).read_bytes() == tiny_gguf

    removed = homeai(env, "models", "rm", NAME)
    assert removed.returncode == 0 and f"removed {NAME}" in removed.stdout
    assert not catalog.listed(catalog.folder(cfg.data_dir))
    refused = homeai(env, "--config", str(config), "models")
    assert refused.returncode == 2 and f"model.path names no file and no local model: {NAME.lower()}" in refused.stderr


def test_an_unknown_quantisation_exits_non_zero_listing_the_repository(env):
    refused = homeai(env, "pull", f"hf.co/{TINY}:Q2_K")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"homeai: {TINY} has no Q2_K: it has hf.co/{TINY}:Q4_K_M, hf.co/{TINY}:Q8_0")
    assert homeai(env, "models", "rm", "nothing").returncode == 1


def test_ctrl_c_keeps_the_part_and_the_next_pull_resumes(env, hub, tmp_path, tiny_gguf):
    # huggingface_hub writes in 10 MiB pieces: a 25 MB file, sent slowly, is cut after one or two.
    big = tiny_gguf + bytes(25_000_000 - len(tiny_gguf))
    hub.add(TINY, "big-Q6_K.gguf", big)
    hub.delay_s = 0.02  # per 64 KiB: about 8 s in all
    name = f"hf.co/{TINY}:Q6_K"
    # A terminal's Ctrl-C: the child hears SIGINT even when this run is a background job (which
    # POSIX shells start with SIGINT ignored, and a child inherits that).
    process = subprocess.Popen([sys.executable, "-m", "homeai.cli", "pull", name], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    partial = tmp_path / "data" / "homeai" / "models" / ".partial"
    deadline = time.monotonic() + 60
    while not (partial.exists() and any(p.stat().st_size for p in partial.glob("*.part"))):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and f"`homeai pull {name}` again resumes it" in err
    part, = partial.glob("*.part")
    kept = part.stat().st_size
    assert 0 < kept < len(big)
    listed = homeai(env, "models")
    assert "of interrupted pulls wait in" in listed.stdout and "`homeai models clean` deletes them" in listed.stdout
    hub.delay_s, hub.ranges = 0.0, []
    assert homeai(env, "pull", name).returncode == 0
    assert hub.ranges == [f"bytes={kept}-"]
    assert (tmp_path / "data" / "homeai" / "models" / "hf.co" / TINY / "big-Q6_K.gguf").read_bytes() == big


def test_pull_with_mmproj_fetches_the_projector_and_says_how_to_serve_both(env):
    pulled = homeai(env, "pull", f"{TINY}:q8_0", "--mmproj")
    assert pulled.returncode == 0, pulled.stderr
    assert f'set model.path = "{NAME}" and model.mmproj = "hf.co/{TINY}:mmproj"' in pulled.stdout
    assert "mmproj-tiny-F16.gguf" in pulled.stdout
