"""Files outside the indexed folders stay out of the index, however a link points at them:
real symlinks, a real index run started over HTTP, and the real search API asked for what the
linked file says. Links that stay inside the configured folders are still followed; a link
turned out of them between runs loses what was indexed through it.

Run: .venv/bin/python -m pytest tests/security/test_symlinks.py
"""

from __future__ import annotations

import os
import time

import httpx
import pytest

from homeai.jobs import extract
from homeai.jobs.extract import FileData, Skip, read_file
from homeai.jobs.scope import OUTSIDE, Scope
from homeai.store.db import make_engine, make_sessionmaker
from tests.api.conftest import TIMEOUT, add_token, api_config, serve
from tests.jobs.conftest import documents, write_docs

SECRET = "root:x:0:0:quokka vault code marmalade 4417:/root:/bin/bash\n"
SECRET_WORDS = ("quokka", "marmalade")


def index_and_wait(http: httpx.Client, admin: str) -> dict:
    headers = {"Authorization": f"Bearer {admin}"}
    r = http.post("/api/jobs/index/run", headers=headers)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        jobs = http.get("/api/jobs", headers=headers).json()
        last = next(j for j in jobs["jobs"] if j["name"] == "index").get("last_run") or {}
        if last.get("status") in ("done", "failed"):
            return last
        time.sleep(0.5)
    raise AssertionError(f"the index run did not end: {last}")


def search(http: httpx.Client, token: str, query: str) -> list[dict]:
    r = http.get("/api/search", params={"q": query, "k": 50}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def stored_documents(cfg) -> dict[str, dict]:
    engine = make_engine(cfg.database_url)
    try:
        return documents(make_sessionmaker(engine))
    finally:
        engine.dispose()


@pytest.mark.model
def test_links_out_of_the_indexed_folders_are_skipped_and_never_searchable(runner, tmp_path):
    secret = tmp_path / "outside" / "passwd"
    write_docs(secret.parent, {"passwd": SECRET})
    docs, other, real_linked = tmp_path / "docs", tmp_path / "other", tmp_path / "real_linked"
    write_docs(docs, {"boiler.md": "The boiler pressure should read 1.5 bar."})
    write_docs(other, {"recipe.txt": "Knead the rye dough with caraway seeds and rest it overnight.",
                       "zoo.txt": "The pangolin sanctuary opens at nine on Saturdays."})
    write_docs(real_linked, {"garden.txt": "Water the courgettes with nettle feed on Sundays."})
    (docs / "passwd_link.txt").symlink_to(secret)  # the probe of issue 15
    (docs / "relative_link.txt").symlink_to(os.path.relpath(secret, docs))
    (docs / "recipe_link.txt").symlink_to(other / "recipe.txt")  # into another configured folder: fine
    moving = docs / "moving_link.txt"
    moving.symlink_to(other / "zoo.txt")  # in for the first run, turned out before the second
    (tmp_path / "linked").symlink_to(real_linked, target_is_directory=True)  # a configured folder that is a link
    (tmp_path / "named_link.txt").symlink_to(secret)  # a file named directly in the config
    paths = [docs, other, tmp_path / "linked", tmp_path / "named_link.txt"]
    cfg = api_config(tmp_path, auth={"required": True},
                     jobs={"index_paths": [str(p) for p in paths], "summarise": False})

    with serve(cfg, runner) as server, httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        admin, member = add_token(cfg, "admin", admin=True), add_token(cfg, "carol")
        refused = http.post("/api/jobs/index/run", headers={"Authorization": f"Bearer {member}"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"
        first = index_and_wait(http, admin)
        assert first["status"] == "done", first
        recipe = {hit["path"] for hit in search(http, member, "caraway rye dough")}
        garden = {hit["path"] for hit in search(http, member, "courgettes nettle")}
        assert str(moving) in {hit["path"] for hit in search(http, member, "pangolin sanctuary")}
        moving.unlink()
        moving.symlink_to(secret)
        second = index_and_wait(http, admin)
        assert second["status"] == "done", second
        leaked = [hit for word in SECRET_WORDS + ("root",) for hit in search(http, member, word)
                  if any(w in hit["snippet"].lower() for w in SECRET_WORDS)]
        assert leaked == [], "the linked file's lines were searchable"

    assert {str(docs / "recipe_link.txt"), str(other / "recipe.txt")} <= recipe
    assert str(tmp_path / "linked" / "garden.txt") in garden
    stored = stored_documents(cfg)
    for name in ("passwd_link.txt", "relative_link.txt", "named_link.txt", "moving_link.txt"):
        assert stored[name]["status"] == "skipped" and stored[name]["reason"] == OUTSIDE, (name, stored[name])
        assert stored[name]["chunks"] == 0 and stored[name]["hash"] == ""
    assert all(stored[name]["status"] == "indexed" for name in ("boiler.md", "recipe_link.txt", "garden.txt"))


def test_a_file_swapped_for_a_link_after_the_check_is_not_read(tmp_path, monkeypatch):
    """The race: the path is checked, then replaced by a link out before it is opened."""
    secret = tmp_path / "passwd"
    secret.write_text(SECRET)
    folder = tmp_path / "docs"
    write_docs(folder, {"notes.txt": "The spare key is with the neighbours."})
    notes, scope = folder / "notes.txt", Scope.of([folder])
    assert isinstance(read_file(notes, scope), FileData)
    real_open = os.open

    def swap_then_open(path, flags, *args, **kwargs):
        if os.fspath(path) == str(notes):
            os.unlink(notes)
            os.symlink(secret, notes)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(extract.os, "open", swap_then_open)
    assert read_file(notes, scope) == Skip(OUTSIDE)


def test_a_fifo_swapped_in_after_the_check_does_not_block(tmp_path, monkeypatch):
    folder = tmp_path / "docs"
    write_docs(folder, {"notes.txt": "The spare key is with the neighbours."})
    notes = folder / "notes.txt"
    real_open = os.open

    def swap_then_open(path, flags, *args, **kwargs):
        if os.fspath(path) == str(notes):
            os.unlink(notes)
            os.mkfifo(notes)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(extract.os, "open", swap_then_open)
    assert "not a regular file" in read_file(notes, Scope.of([folder])).reason
