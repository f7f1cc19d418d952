"""Local models by name: what `homeai pull` placed under the data directory's `models/`, and any
GGUF put straight into that folder by hand.

A pulled model is a manifest, `models/manifests/hf.co/<org>/<repo>/<tag>.json`, naming its files
(one, or every part of a split model, the first being what llama.cpp loads) with their sizes and
digests; the files lie under `models/hf.co/<org>/<repo>/` as the repository names them.
The manifest is written last, once every file is whole and checked, so a listed model is complete.
A GGUF lying directly in `models/` is listed by its file name without `.gguf`.

Names are Ollama's Hugging Face names, `hf.co/<org>/<repo>:<tag>` (the tag a quantisation such as
`Q4_K_M`, or a file name); they match without regard to case, with or without `hf.co/`, and a
repository alone names its only local model.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

HOST = "hf.co"
HOSTS = ("hf.co/", "huggingface.co/", "https://huggingface.co/", "https://hf.co/")
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
TAG = re.compile(r"[\w.-]+")  # a quantisation or a file's name, never a folder
MANIFESTS = "manifests"
PARTIAL = ".partial"  # files being downloaded (homeai.pull); never listed


@dataclass(frozen=True)
class HubName:
    """A Hugging Face model name: the repository and the tag asked for (None: the default)."""
    repo: str
    tag: str | None

    def __str__(self) -> str:
        return f"{HOST}/{self.repo}" + (f":{self.tag}" if self.tag else "")


@dataclass(frozen=True)
class LocalFile:
    path: Path
    size: int
    digest: str  # "sha256:<hex>" as the hub gave it; "" for a file placed by hand


@dataclass(frozen=True)
class LocalModel:
    name: str  # "hf.co/<org>/<repo>:<tag>", or a hand-placed file's name without .gguf
    files: tuple[LocalFile, ...]
    manifest: Path | None  # None for a hand-placed file

    @property
    def path(self) -> Path:
        """What llama.cpp loads (a split model's first part)."""
        return self.files[0].path

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def parse(name: str) -> HubName:
    """`hf.co/<org>/<repo>[:<tag>]` or `<org>/<repo>[:<tag>]`; ValueError for anything else."""
    text = name.strip()
    for host in HOSTS:
        if text.lower().startswith(host):
            text = text[len(host):]
            break
    repo, _, tag = text.partition(":")
    if not REPO_ID.fullmatch(repo) or ".." in repo or (tag and (not TAG.fullmatch(tag) or ".." in tag)):
        raise ValueError(f"{name!r} is not a Hugging Face model name: use hf.co/<org>/<repo>[:<quantisation>], "
                         f"e.g. hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M")
    return HubName(repo, None if tag in ("", "latest") else tag)


def folder(data_dir: Path) -> Path:
    return Path(data_dir) / "models"


def listed(models: Path) -> list[LocalModel]:
    """Every local model: pulled ones by name, then hand-placed GGUFs."""
    pulled = [_read_manifest(p, models) for p in sorted((models / MANIFESTS).rglob("*.json"))]
    loose = [LocalModel(p.name.removesuffix(".gguf"), (LocalFile(p, p.stat().st_size, ""),), None)
             for p in sorted(models.glob("*.gguf")) if p.is_file()]
    return [m for m in pulled if m is not None] + loose


def find(models: Path, name: str) -> LocalModel | None:
    """The local model `name` names, or None."""
    everything = listed(models)
    wanted = name.strip().lower().removesuffix(":latest")
    for model in everything:
        if model.name.lower() in (wanted, wanted.removesuffix(".gguf")):
            return model
    try:
        asked = parse(name)
    except ValueError:
        return None
    same_repo = [m for m in everything if m.manifest and m.name.lower().startswith(f"{HOST}/{asked.repo}:".lower())]
    if asked.tag is not None:
        same_repo = [m for m in same_repo if m.name.lower() == str(asked).lower()]
    return same_repo[0] if len(same_repo) == 1 else None


def resolve(value: str, models: Path) -> Path | None:
    """A config's `model.path`: a GGUF file, else a local model's name; None when it is neither."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    model = find(models, value)
    return model.path if model is not None else None


def spelling(models: Path, name: HubName) -> HubName:
    """`name` with its repository spelt as a local model of that repository spells it: the hub
    ignores case in repository names, a folder may not."""
    for model in listed(models):
        repo = model.name[len(HOST) + 1:].rpartition(":")[0]
        if model.manifest is not None and repo.lower() == name.repo.lower():
            return HubName(repo, name.tag)
    return name


def manifest_path(models: Path, name: HubName) -> Path:
    return models / MANIFESTS / HOST / name.repo / f"{name.tag}.json"


def write_manifest(models: Path, name: HubName, files: list[LocalFile], source: dict) -> LocalModel:
    """Record a pulled model, atomically (its files are already whole and checked)."""
    target = manifest_path(models, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    doc = {"name": str(name), **source,
           "files": [{"path": f.path.relative_to(models).as_posix(), "size": f.size, "digest": f.digest}
                     for f in files]}
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, target)
    return LocalModel(str(name), tuple(files), target)


def remove(models: Path, name: str) -> LocalModel:
    """Delete a local model: its manifest, then its files no other manifest names."""
    model = find(models, name)
    if model is None:
        raise KeyError(unknown(models, name))
    if model.manifest is not None:
        model.manifest.unlink()
        _prune(model.manifest.parent, models / MANIFESTS)
    kept = {f.path.resolve() for m in listed(models) for f in m.files}
    for f in model.files:
        if f.path.resolve() not in kept:
            f.path.unlink(missing_ok=True)
            _prune(f.path.parent, models)
    return model


def unknown(models: Path, name: str) -> str:
    have = ", ".join(m.name for m in listed(models)) or "none"
    return f"no local model {name!r} (local models: {have}; `homeai pull` fetches one)"


def _read_manifest(path: Path, models: Path) -> LocalModel | None:
    """A manifest whose files are all there at their recorded sizes; None otherwise (a model removed by hand)."""
    try:
        doc = json.loads(path.read_text())
        files = tuple(LocalFile(models / f["path"], f["size"], f["digest"]) for f in doc["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not files or not all(f.path.is_file() and f.path.stat().st_size == f.size for f in files):
        return None
    return LocalModel(doc["name"], files, path)


def _prune(folder: Path, root: Path) -> None:
    """Remove empty folders from `folder` up to, not including, `root`."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
