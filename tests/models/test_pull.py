"""`homeai.pull` against the hub stand-in, through the real huggingface_hub client: names, quantisations,
split models, progress, interruption and resume, a corrupt download, a full disk, tokens, no network.

Run: .venv/bin/python -m pytest tests/models/test_pull.py
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections import namedtuple

import pytest

from homeai import catalog, pull
from tests.models.conftest import PIECE, SPLIT, TINY, other_bytes


def steps_of(name, models, **kwargs):
    seen = []
    model = pull.pull(name, models, seen.append, **kwargs)
    return model, seen


def refused(name, models, **kwargs) -> pull.PullError:
    with pytest.raises(pull.PullError) as caught:
        pull.pull(name, models, **kwargs)
    return caught.value


def test_default_quantisation_is_q4_k_m_with_ollamas_progress(hub, models, tiny_gguf):
    model, steps = steps_of(f"hf.co/{TINY}", models)
    assert model.name == f"hf.co/{TINY}:Q4_K_M"
    assert model.path == models / "hf.co" / TINY / "tiny-Q4_K_M.gguf"
    assert model.path.read_bytes() == other_bytes(tiny_gguf, b"q4km")
    statuses = [s.status for s in steps]
    assert statuses[0] == "pulling manifest" and statuses[-2:] == ["writing manifest", "success"]
    assert "verifying sha256 digest" in statuses
    digest = "sha256:" + hashlib.sha256(model.path.read_bytes()).hexdigest()
    downloading = [s for s in steps if s.digest]
    assert {s.digest for s in downloading} == {digest} and {s.total for s in downloading} == {len(tiny_gguf)}
    completed = [s.completed for s in downloading]
    assert completed == sorted(completed) and completed[-1] == len(tiny_gguf) and len(set(completed)) > 3
    assert downloading[0].status == f"pulling {digest[7:19]}"
    assert [m.name for m in catalog.listed(models)] == [model.name]
    assert not list((models / ".partial").glob("*.part"))


def test_quantisation_by_any_case_and_the_plain_repo_form(hub, models, tiny_gguf):
    model = pull.pull(f"{TINY}:q8_0", models)
    assert model.name == f"hf.co/{TINY}:Q8_0" and model.path.read_bytes() == tiny_gguf
    assert catalog.find(models, f"hf.co/{TINY.lower()}:Q8_0") == model


def test_a_file_by_its_name(hub, models):
    model = pull.pull(f"hf.co/{TINY}:tiny-Q8_0.gguf", models)
    assert model.name == f"hf.co/{TINY}:tiny-Q8_0.gguf" and model.path.name == "tiny-Q8_0.gguf"


def test_an_unknown_quantisation_lists_what_the_repository_has(hub, models):
    error = refused(f"hf.co/{TINY}:Q5_K_M", models)
    assert error.status == 404
    assert str(error) == f"{TINY} has no Q5_K_M: it has hf.co/{TINY}:Q4_K_M, hf.co/{TINY}:Q8_0"  # never the mmproj
    assert not hub.ranges and not catalog.listed(models)


def test_several_quantisations_and_none_the_default_asks_for_one(hub, models, tiny_gguf):
    hub.repos[TINY].pop("tiny-Q4_K_M.gguf")
    hub.add(TINY, "tiny-Q6_K.gguf", other_bytes(tiny_gguf, b"q6k"))
    error = refused(f"hf.co/{TINY}", models)
    assert str(error) == f"{TINY} has several models; name one: hf.co/{TINY}:Q6_K, hf.co/{TINY}:Q8_0"


def test_an_unknown_repository_or_a_bad_name(hub, models):
    error = refused("hf.co/acme/Nothing-GGUF:Q4_K_M", models)
    assert error.status == 404 and str(error) == f"no repository acme/Nothing-GGUF on {hub.url} (a private one needs HF_TOKEN)"
    error = refused("llama3.2", models)
    assert error.status == 404 and "'llama3.2' is not a Hugging Face model name" in str(error)
    hub.add("acme/Safetensors", "model.safetensors", b"x")
    assert "acme/Safetensors has no GGUF files" in str(refused("acme/Safetensors", models))


def test_a_split_model_is_fetched_whole(hub, models, tiny_split):
    model = pull.pull(f"hf.co/{SPLIT}:Q8_0", models)
    assert model.name == f"hf.co/{SPLIT}:Q8_0" and len(model.files) == 3
    assert model.path.name == "split-Q8_0-00001-of-00003.gguf"
    assert {f.path.name: f.path.read_bytes() for f in model.files} == tiny_split
    assert model.size == sum(len(data) for data in tiny_split.values())
    hub.repos[SPLIT].pop("Q8_0/split-Q8_0-00002-of-00003.gguf")
    shutil.rmtree(models)
    assert "split in 3 parts but the repository has 2" in str(refused(f"hf.co/{SPLIT}:Q8_0", models))


def test_a_dropped_connection_is_resumed_where_it_broke(hub, models, tiny_gguf):
    hub.cut_after, hub.cuts_left = 4 * PIECE + 1000, 1
    model = pull.pull(f"hf.co/{TINY}:Q8_0", models)
    assert model.path.read_bytes() == tiny_gguf
    assert hub.ranges == [None, f"bytes={4 * PIECE}-"]  # whole pieces kept, the broken one read again


def test_an_interrupted_pull_resumes_next_time(hub, models, tiny_gguf):
    # The connection breaks, and the hub then refuses: the pull gives up, keeping what it has.
    hub.cut_after, hub.cuts_left, hub.max_downloads = 6 * PIECE + 10, 1, 1
    error = refused(f"hf.co/{TINY}:Q8_0", models)
    assert error.status == 502 and "\n" not in str(error)
    parts = list((models / ".partial").glob("*.part"))
    assert len(parts) == 1 and parts[0].stat().st_size == 6 * PIECE
    assert not catalog.listed(models) and not (models / "hf.co" / TINY / "tiny-Q8_0.gguf").exists()
    hub.ranges, hub.max_downloads = [], None
    model = pull.pull(f"hf.co/{TINY}:Q8_0", models)
    assert hub.ranges == [f"bytes={6 * PIECE}-"] and model.path.read_bytes() == tiny_gguf


def test_a_corrupt_download_is_refused_and_deleted(hub, models):
    hub.corrupt = True
    error = refused(f"hf.co/{TINY}:Q8_0", models)
    assert error.status == 502 and "tiny-Q8_0.gguf is corrupt" in str(error)
    assert not list(models.rglob("*.gguf")) and not list(models.rglob("*.part")) and not catalog.listed(models)


def test_not_enough_disk_is_refused_before_downloading(hub, models, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(pull.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 50_000_000, 50_000_000))
    error = refused(f"hf.co/{TINY}:Q8_0", models)
    assert error.status == 507 and "not enough disk" in str(error) and "0.05 GB are free" in str(error)
    assert not hub.ranges and not list(models.rglob("*.part"))


def test_a_cancelled_pull_keeps_its_part_and_resumes(hub, models, tiny_gguf):
    cancel = threading.Event()

    def report(step):
        if step.completed and step.completed >= 3 * PIECE:
            cancel.set()

    with pytest.raises(pull.Cancelled):
        pull.pull(f"hf.co/{TINY}:Q8_0", models, report, cancel)
    part, = (models / ".partial").glob("*.part")
    assert part.stat().st_size == 3 * PIECE
    hub.ranges = []
    assert pull.pull(f"hf.co/{TINY}:Q8_0", models).path.read_bytes() == tiny_gguf
    assert hub.ranges == [f"bytes={3 * PIECE}-"]


def test_pulling_a_pulled_model_again_downloads_nothing(hub, models):
    first = pull.pull(f"hf.co/{TINY}:Q8_0", models)
    hub.ranges = []
    assert pull.pull(f"hf.co/{TINY.lower()}:q8_0", models) == first and hub.ranges == []  # the hub ignores case
    assert catalog.listed(models) == [first]


def test_one_pull_of_a_name_at_a_time(hub, models):
    hub.delay_s = 0.05
    cancel = threading.Event()
    first = threading.Thread(target=lambda: pytest.raises(pull.Cancelled, pull.pull, f"hf.co/{TINY}:Q8_0", models,
                                                           cancel=cancel))
    first.start()
    try:
        deadline = time.monotonic() + 30
        while not hub.ranges and time.monotonic() < deadline:
            time.sleep(0.02)
        error = refused(f"{TINY.lower()}:q8_0", models)
        assert error.status == 409 and "is being pulled already" in str(error)
    finally:
        cancel.set()
        first.join(30)


def test_a_token_the_hub_refuses_says_so_in_one_line(hub, models, monkeypatch):
    hub.token = "hf_good"
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    error = refused(f"hf.co/{TINY}:Q8_0", models)
    assert error.status == 401 and str(error) == f"{hub.url} refused the token (HF_TOKEN or `hf auth login`): 401"
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    assert pull.pull(f"hf.co/{TINY}:Q8_0", models).name == f"hf.co/{TINY}:Q8_0"


def test_no_network_says_so_in_one_line(hub, models, monkeypatch):
    import types

    from huggingface_hub.utils import _http

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard: nothing listens
    waits = []  # huggingface_hub's backoff between its retries (1+2+4+8+8 s), counted here, not slept
    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=waits.append))
    error = refused(f"hf.co/{TINY}:Q8_0", models)
    assert error.status == 502 and str(error).startswith("cannot reach http://127.0.0.1:9: ConnectError")
    assert "\n" not in str(error)
    assert len(waits) >= 1, "the hub's client gave up without retrying"


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MB filesystem of its own (tmpfs), where this box lets the tests mount one (root); else skipped."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a small filesystem here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_disk_that_fills_up_during_the_pull_leaves_nothing_behind(hub, small_disk, monkeypatch, tiny_gguf):
    models = small_disk / "models"
    monkeypatch.setattr(pull, "RESERVE_BYTES", 0)

    def someone_else_writes(step):  # once the download has begun, another program takes 4 MB of the 8
        if step.completed and not (small_disk / "filler").exists():
            (small_disk / "filler").write_bytes(bytes(4_000_000))

    error = refused(f"hf.co/{TINY}:Q8_0", models, report=someone_else_writes)
    assert error.status == 507 and "the disk filled up" in str(error)
    assert not list(models.rglob("*.part")) and not list(models.rglob("*.gguf")) and not catalog.listed(models)


def test_a_models_folder_that_cannot_be_written_says_so(hub, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    error = refused(f"hf.co/{TINY}:Q8_0", blocked / "models")
    assert error.status == 500 and str(error) == f"cannot write in {blocked / 'models'}: Not a directory"
    assert not hub.ranges


def test_a_split_model_interrupted_keeps_its_checked_parts_for_the_next_pull(hub, models, tiny_split):
    hub.max_downloads = 2  # the third part's download is refused
    assert refused(f"hf.co/{SPLIT}:Q8_0", models).status == 502
    assert len(list(models.glob(".partial/*.checked"))) == 2
    assert not list(models.rglob("*.gguf")) and not catalog.listed(models)  # no part takes its name alone
    hub.ranges, hub.max_downloads = [], None
    model = pull.pull(f"hf.co/{SPLIT}:Q8_0", models)
    assert hub.ranges == [None]  # only the third part is fetched
    assert {f.path.name: f.path.read_bytes() for f in model.files} == tiny_split
    assert not list(models.glob(".partial/*.checked")) and not list(models.glob(".partial/*.part"))


def test_interrupted_pulls_can_be_forgotten_but_not_while_a_pull_runs(hub, models, tiny_gguf):
    cancel = threading.Event()
    with pytest.raises(pull.Cancelled):
        pull.pull(f"hf.co/{TINY}:Q8_0", models, lambda step: step.completed and cancel.set(), cancel)
    assert pull.unfinished(models) == PIECE
    hub.delay_s = 0.05
    running = threading.Event()
    second = threading.Thread(target=lambda: pytest.raises(pull.Cancelled, pull.pull, f"hf.co/{TINY}:Q4_K_M", models,
                                                            lambda step: step.completed and running.set(), cancel))
    cancel.clear()
    second.start()
    try:
        assert running.wait(30)
        with pytest.raises(pull.PullError) as refused_while_running:
            pull.forget_unfinished(models)
        assert refused_while_running.value.status == 409
    finally:
        cancel.set()
        second.join(30)
    assert pull.forget_unfinished(models) >= PIECE and pull.unfinished(models) == 0
    hub.delay_s, hub.ranges = 0.0, []
    pull.pull(f"hf.co/{TINY}:Q8_0", models)
    assert hub.ranges == [None]  # started over


def test_a_repositorys_vision_projector_is_pulled_as_a_model_of_its_own(hub, models, tiny_mmproj, tmp_path):
    from homeai import doctor
    from homeai.config import from_dict
    from homeai.models import projector

    model, steps = steps_of(f"hf.co/{TINY}", models, projector=True)
    assert model.name == f"hf.co/{TINY}:mmproj" and model.path.name == "mmproj-tiny-F16.gguf"  # f16 over f32
    assert model.path.read_bytes() == tiny_mmproj and steps[-1].status == "success"
    assert catalog.resolve(f"hf.co/{TINY}:mmproj", models) == model.path
    cfg = from_dict({"server": {"data_dir": str(models.parent)}, "model": {"mmproj": f"hf.co/{TINY}:mmproj"}})
    assert projector(cfg) == model.path
    assert doctor.facts(cfg)["images"].startswith(f"understood, by {model.path}")
    assert "no vision projector" in str(refused(f"hf.co/{SPLIT}", models, projector=True))
    chosen = steps_of(f"hf.co/{TINY}:mmproj-tiny-F32.gguf", models, projector=True)[0]
    assert chosen.path.name == "mmproj-tiny-F32.gguf"  # a file named is the one pulled
