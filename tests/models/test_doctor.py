"""`homeai doctor`'s warnings about the model: the embedded demo served, a model and its KV caches larger
than the memory it sees; a local model by name in its facts. A real process, as a user runs it.

Run: .venv/bin/python -m pytest tests/models/test_doctor.py
"""

from __future__ import annotations

import os
import subprocess
import sys

from homeai.gguf_header import kv_bytes_per_cell, metadata
from homeai.models import embedded_gguf

EMBEDDED_WARNING = "warning: the served model is the embedded SmolLM2-135M, a demo"


def doctor(tmp_path, config: str) -> subprocess.CompletedProcess:
    path = tmp_path / "homeai.toml"
    path.write_text(config)
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run([sys.executable, "-m", "homeai.cli", "--config", str(path), "doctor"], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_embedded_model_is_a_warning(tmp_path):
    out = doctor(tmp_path, "")
    assert out.returncode == 0, out.stderr
    assert EMBEDDED_WARNING in out.stdout
    assert "model memory" in out.stdout and "KV caches need" not in out.stdout


def test_a_local_model_by_name_is_no_warning(tmp_path, tiny_gguf):
    models = tmp_path / "data" / "homeai" / "models"
    models.mkdir(parents=True)
    (models / "tiny-house.gguf").write_bytes(tiny_gguf)
    out = doctor(tmp_path, '[model]\npath = "tiny-house"\n')
    assert out.returncode == 0, out.stderr
    assert f"{models / 'tiny-house.gguf'} (5.2 MB)" in out.stdout
    assert "warning:" not in out.stdout


def test_caches_larger_than_memory_are_a_warning(tmp_path):
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    per_cell = kv_bytes_per_cell(metadata(embedded_gguf()))  # 23,040 bytes: 30 layers, 3 KV heads of 64
    cells = ram // per_cell + 256
    out = doctor(tmp_path, f"[model]\nn_ctx = {cells}\ninteractive_n_ctx = 0\n")
    assert out.returncode == 0, out.stderr
    warning, = [line for line in out.stdout.splitlines() if "KV caches need" in line]
    assert "RAM has" in warning and "lower model.n_ctx" in warning
