"""Ollama's `/api/pull`, `/api/tags`, `/api/show`, `/api/ps` for local models, through the real `ollama`
client (Home Assistant's) and raw HTTP, on a real server, downloading from the hub stand-in.

Run: .venv/bin/python -m pytest tests/models/test_api_pull.py
"""

from __future__ import annotations

import hashlib
import json
import time

import httpx
import ollama
import pytest

from homeai import catalog
from tests.api.conftest import TIMEOUT, add_token, api_config, serve
from tests.models.conftest import PIECE, TINY

pytestmark = pytest.mark.model

NAME = f"hf.co/{TINY}:Q8_0"


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("api_pull")


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True}, server={"data_dir": str(module_tmp / "data")})


@pytest.fixture(scope="module")
def server(cfg, runner):
    with serve(cfg, runner) as running:
        yield running


@pytest.fixture(scope="module")
def admin_token(cfg, server):
    return add_token(cfg, "root", admin=True)


@pytest.fixture(scope="module")
def admin(server, admin_token):
    return ollama.Client(host=server.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=TIMEOUT)


@pytest.fixture
def models(cfg, hub):
    """The server's models folder, emptied before each test."""
    folder = catalog.folder(cfg.data_dir)
    for model in catalog.listed(folder):
        catalog.remove(folder, model.name)
    for part in folder.glob(".partial/*"):
        part.unlink()
    return folder


def test_pull_streams_ollamas_progress_then_lists_and_shows_the_model(admin, models, tiny_gguf, server):
    progress = list(admin.pull(NAME, stream=True))
    statuses = [p.status for p in progress]
    digest = "sha256:" + hashlib.sha256(tiny_gguf).hexdigest()
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert "verifying sha256 digest" in statuses and "writing manifest" in statuses
    downloading = [p for p in progress if p.digest]
    assert {p.digest for p in downloading} == {digest} and {p.total for p in downloading} == {len(tiny_gguf)}
    assert [p.completed for p in downloading][-1] == len(tiny_gguf) and len(downloading) > 3

    listed = {m.model: m for m in admin.list().models}
    card = server.program.models["generate"]
    lane_names = {f"{card.id}:{lane}" for lane in ("voice", "chat", "summaries", "indexing")}  # the served model's (issue 27)
    assert set(listed) == {f"{card.id}:latest", NAME} | lane_names
    pulled = listed[NAME]
    assert pulled.size == len(tiny_gguf) and pulled.digest == digest[7:]
    assert pulled.details.quantization_level == "Q8_0" and pulled.details.family == "llama"
    shown = admin.show(NAME.lower())
    assert shown.modelinfo["llama.context_length"] == 8192 and shown.capabilities == ["completion", "tools"]
    assert shown.modelfile == "FROM " + str(models / "hf.co" / TINY / "tiny-Q8_0.gguf") + "\n"  # an admin's view
    assert [m.model for m in admin.ps().models] == [f"{card.id}:latest"]  # only the served one is loaded
    assert admin.pull(NAME).status == "success"  # there already: nothing downloaded
    with pytest.raises(ollama.ResponseError) as refused:
        admin.chat(model=NAME, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 404  # pulled, not served: model.path and a restart switch it


def test_whole_answer_with_stream_false(admin, models, tiny_gguf):
    assert admin.pull(f"{TINY}:q8_0", stream=False).status == "success"
    assert (models / "hf.co" / TINY / "tiny-Q8_0.gguf").read_bytes() == tiny_gguf


def test_unknown_repository_or_quantisation_is_an_error_listing_what_it_has(admin, models, hub):
    with pytest.raises(ollama.ResponseError) as refused:
        admin.pull(f"hf.co/{TINY}:Q3_K_S")
    assert refused.value.status_code == 404
    assert refused.value.error == f"{TINY} has no Q3_K_S: it has hf.co/{TINY}:Q4_K_M, hf.co/{TINY}:Q8_0"
    with pytest.raises(ollama.ResponseError) as refused:
        list(admin.pull("hf.co/acme/none", stream=True))
    assert refused.value.status_code == 404 and "no repository acme/none" in refused.value.error
    with pytest.raises(ollama.ResponseError) as refused:
        admin.pull("llama3.2")
    assert refused.value.status_code == 404 and "'llama3.2' is not a Hugging Face model name" in refused.value.error
    assert not hub.ranges


def test_a_member_may_not_pull(cfg, server, models, hub):
    member = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {add_token(cfg, 'kid')}"},
                           timeout=TIMEOUT)
    with pytest.raises(ollama.ResponseError) as refused:
        member.pull(NAME)
    assert refused.value.status_code == 403 and not hub.ranges


def test_a_corrupt_download_ends_the_stream_with_an_error(admin, models, hub):
    hub.corrupt = True
    with pytest.raises(ollama.ResponseError) as refused:
        list(admin.pull(NAME, stream=True))
    assert "tiny-Q8_0.gguf is corrupt" in refused.value.error
    assert not catalog.listed(models) and not list(models.rglob("*.part"))


def test_a_client_that_leaves_cancels_its_pull_and_the_next_resumes(server, admin_token, admin, models, hub,
                                                                     tiny_gguf):
    hub.delay_s = 0.05  # per 64 KiB: about 4 s for the whole file
    headers = {"Authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=headers) as http:
        with http.stream("POST", "/api/pull", json={"model": NAME}) as answer:
            assert answer.status_code == 200
            lines = answer.iter_lines()
            while json.loads(next(lines)).get("completed", 0) < 2 * PIECE:
                pass
            second = http.post("/api/pull", json={"model": NAME.lower()})
            assert second.status_code == 409 and "is being pulled already" in second.json()["error"]
            lines.close()  # the client leaves mid-download: httpx drops the connection of an unread answer
    part, = models.glob(".partial/*.part")
    sizes = [part.stat().st_size]
    while len(sizes) < 3 or sizes[-1] != sizes[-3]:  # still for 1 s: the pull has stopped
        time.sleep(0.5)
        sizes.append(part.stat().st_size)
        assert len(sizes) < 60
    kept = sizes[-1]
    assert 2 * PIECE <= kept < len(tiny_gguf) and not catalog.listed(models)
    hub.delay_s, hub.ranges = 0.0, []
    assert admin.pull(NAME).status == "success"
    assert hub.ranges == [f"bytes={kept}-"]
    assert (models / "hf.co" / TINY / "tiny-Q8_0.gguf").read_bytes() == tiny_gguf


def test_delete_removes_a_local_model_but_never_the_served_one(cfg, server, admin, models, hub):
    admin.pull(NAME)
    member = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {add_token(cfg, 'teen')}"},
                           timeout=TIMEOUT)
    with pytest.raises(ollama.ResponseError) as refused:
        member.delete(NAME)
    assert refused.value.status_code == 403
    assert admin.delete(NAME.lower()).status == "success"
    assert NAME not in {m.model for m in admin.list().models} and not catalog.listed(models)
    with pytest.raises(ollama.ResponseError) as refused:
        admin.delete(NAME)
    assert refused.value.status_code == 404
    served = catalog.folder(cfg.data_dir) / "served.gguf"  # a local model that is the served file
    served.symlink_to(server.program.models["generate"].path)
    try:
        with pytest.raises(ollama.ResponseError) as refused:
            admin.delete("served")
        assert refused.value.status_code == 400 and "is the model being served" in refused.value.error
        assert served.exists()
    finally:
        served.unlink()
