"""`homeai bench model`: a random-weight GGUF in a real model's shape, loaded and benchmarked."""

from __future__ import annotations

import json

import pytest

from homeai.bench.random_model import SHAPES, write
from tests.test_cli import homeai


def test_a_random_model_is_written_then_benchmarked_as_a_user_would(tmp_path):
    model = tmp_path / "tiny.gguf"
    out = homeai("bench", "model", str(model), "--shape", "tiny", tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "random weights in the tiny shape" in out.stdout and model.stat().st_size > 1_000_000
    config = tmp_path / "homeai.toml"
    config.write_text(f'[model]\npath = "{model}"\nn_ctx = 2048\ninteractive_n_ctx = 1024\nn_batch = 256\n')
    out = homeai("--config", str(config), "bench", "continuous", "--quick", "--out", str(tmp_path / "b"),
                 tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "b" / "continuous.json").read_text())
    for policy, m in doc["policies"].items():  # its answers are noise, but every one is generated in full
        assert m["overall"]["succeeded"] == doc["params"]["requests"], policy
    assert doc["machine"].startswith("llama")  # llama.cpp's description of the model it loaded


def test_the_weight_type_sets_the_size(tmp_path):
    sizes = {t: write(tmp_path / f"tiny-{t}.gguf", "tiny", t) for t in ("q4_0", "q8_0", "f16")}
    assert sizes["q4_0"] < sizes["q8_0"] < sizes["f16"]
    assert sizes["f16"] > 2 * 49152 * SHAPES["tiny"].hidden  # the token embeddings alone, 2 bytes a weight


def test_a_bad_shape_or_type_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="smollm2-360m"):
        write(tmp_path / "x.gguf", "huge")
    with pytest.raises(ValueError, match="q4_0, q8_0, f16"):
        write(tmp_path / "x.gguf", "tiny", "q3")
    out = homeai("bench", "model", str(tmp_path / "x.gguf"), "--shape", "huge", tmp_path=tmp_path)
    assert out.returncode == 2 and "unknown shape 'huge'" in out.stderr
