"""Switching the served model as a household does: pull a model split in parts (llama.cpp's gguf-split
layout) from the hub stand-in, set `model.path` to its name, start the server, and ask it through
the `ollama` client. The model has random weights (its answer is noise): what is checked is that
the pulled parts load and answer, listed and described by their names.

Run: .venv/bin/python -m pytest tests/models/test_serve_pulled.py
"""

from __future__ import annotations

import httpx
import ollama
import pytest

from homeai import pull
from homeai.config import from_dict
from homeai.app import load_runner
from homeai.models import generation_model
from tests.api.conftest import TIMEOUT, serve
from tests.models.conftest import SPLIT

pytestmark = pytest.mark.model

NAME = f"hf.co/{SPLIT}:Q8_0"


def test_a_pulled_split_model_served_by_its_name(hub, tmp_path):
    data = tmp_path / "data"
    model = pull.pull(NAME, data / "models")
    assert len(model.files) == 3
    cfg = from_dict({"server": {"data_dir": str(data)}, "database": {"url": f"sqlite:///{tmp_path / 'h.db'}"},
                     "model": {"path": NAME.lower(), "n_ctx": 1024, "interactive_n_ctx": 512, "n_batch": 256,
                               "n_seq_max": 4, "embed_n_ctx": 256, "embed_n_seq_max": 4}}, "(test)")
    assert generation_model(cfg) == model.path  # the first part: llama.cpp finds the others beside it
    runner = load_runner(cfg, embeddings=False, grammar=False)
    try:
        with serve(cfg, runner) as server:
            client = ollama.Client(host=server.url, timeout=TIMEOUT)
            served = f"{server.program.models['generate'].id}:latest"
            assert served == "split-Q8_0-00001-of-00003:latest"
            lane_names = {served.replace(":latest", f":{lane}") for lane in ("voice", "chat", "summaries", "indexing")}  # issue 27
            assert {m.model for m in client.list().models} == {served, NAME} | lane_names
            assert [m.model for m in client.ps().models] == [served]
            assert client.show(NAME.lower()).details.quantization_level == "Q8_0"
            answer = client.generate(model=served, prompt="Hello", options={"num_predict": 4, "seed": 1})
            assert answer.done and answer.eval_count > 0
            by_name = client.chat(model=NAME.lower(), messages=[{"role": "user", "content": "Hi"}],
                                  options={"num_predict": 4, "seed": 1})  # the served file by its local name
            assert by_name.done and by_name.eval_count > 0
            with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
                answered = http.post("/v1/chat/completions", json={
                    "model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            assert answered.status_code == 200, answered.text
            assert client.pull(NAME).status == "success"  # served already: nothing downloaded
    finally:
        runner.close()


def test_a_hand_placed_file_served_by_its_name_is_listed_once(tmp_path, tiny_gguf):
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / "tiny-house.gguf").write_bytes(tiny_gguf)
    (models / "spare.gguf").write_bytes(tiny_gguf)
    cfg = from_dict({"server": {"data_dir": str(tmp_path / "data")},
                     "database": {"url": f"sqlite:///{tmp_path / 'h.db'}"},
                     "model": {"path": "tiny-house", "n_ctx": 1024, "interactive_n_ctx": 512, "n_batch": 256,
                               "n_seq_max": 4, "embed_n_ctx": 256, "embed_n_seq_max": 4}}, "(test)")
    runner = load_runner(cfg, embeddings=False, grammar=False)
    try:
        with serve(cfg, runner) as server:
            client = ollama.Client(host=server.url, timeout=TIMEOUT)
            lane_names = [f"tiny-house:{lane}" for lane in ("voice", "chat", "summaries", "indexing")]  # the served model's (issue 27)
            assert sorted(m.model for m in client.list().models) == sorted(["spare:latest", "tiny-house:latest",
                                                                            *lane_names])
            assert client.show("spare").capabilities == ["completion", "tools"]
    finally:
        runner.close()
