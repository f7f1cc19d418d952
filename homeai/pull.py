"""`homeai pull` and Ollama's `/api/pull`: a GGUF model from Hugging Face into the data directory's `models/`.

Names are Ollama's: `hf.co/<org>/<repo>[:<quantisation or file>]`, or `<org>/<repo>[:...]`.
The repository's tree (huggingface_hub's `list_repo_tree`) gives its GGUF files with their sizes
and sha256 digests; the quantisation is matched against the file names (`Q4_K_M` when none is
asked for and the repository has it), a vision projector (`mmproj`) is never chosen, and a model
split in parts (`-00001-of-00003.gguf`) is fetched whole.

Each file is fetched with huggingface_hub's `http_get` (its session: `HF_ENDPOINT`, `HF_TOKEN` or
the token `hf auth login` saved, retries that resume a dropped connection) into
`models/.partial/<digest>.part`, resumed from there after an interruption, checked against the
hub's digest (`.checked`), and moved to its name once every part of the model is checked; the
manifest (`homeai.catalog`) is written last. A full disk leaves nothing of the model; a corrupt
file is deleted and refused.
Progress is reported as Ollama words it (`Step`), for the CLI's bar and `/api/pull`'s lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from homeai import catalog
from homeai.catalog import HubName, LocalFile, LocalModel

DEFAULT_QUANT = "Q4_K_M"  # Ollama's choice when a name has no tag
REVISION = "main"
QUANT = re.compile(r"(?:^|[-._])((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?))$", re.IGNORECASE)
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
RESERVE_BYTES = 100_000_000  # free space left over once a model is in


class PullError(Exception):
    """Why a pull failed, in one line, with the HTTP status `/api/pull` answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Cancelled(PullError):
    def __init__(self):
        super().__init__("the pull was cancelled; pulling the same name again resumes it", 499)


@dataclass(frozen=True)
class RemoteFile:
    path: str  # in the repository
    size: int
    sha256: str  # the hub's LFS digest; "" for a file kept in git itself
    git_oid: str  # the git blob id (SHA-1), checked when there is no sha256

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256}" if self.sha256 else f"sha1:{self.git_oid}"

    @property
    def quant(self) -> str:
        match = QUANT.search(SPLIT.sub("", self.path.rsplit("/", 1)[-1]).removesuffix(".gguf").removesuffix(".GGUF"))
        return match.group(1).upper() if match else ""


@dataclass(frozen=True)
class Plan:
    name: HubName  # with the tag chosen: the quantisation, or the file asked for
    files: tuple[RemoteFile, ...]  # a split model's parts in order
    endpoint: str

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Step:
    """Progress as Ollama reports it: a status, and while a file downloads its digest and bytes."""
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


def endpoint() -> str:
    """The hub: `HF_ENDPOINT`, read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


PROJECTOR_TAG = "mmproj"
PROJECTOR_TYPES = ("F16", "BF16", "F32", "Q8_0")  # in the order one is chosen


def pull(name: str, models: Path, report: Callable[[Step], None] = lambda step: None,
         cancel: threading.Event | None = None, projector: bool = False) -> LocalModel:
    """Fetch `name` into `models`, checked, and record it; the local model (with `projector`: the
    repository's vision projector instead). PullError on failure."""
    report(Step("pulling manifest"))
    return fetch(plan(name, projector), models, report, cancel)


def plan(name: str, projector: bool = False) -> Plan:
    """The files `name` stands for in its repository (or its projector's); PullError listing what it has
    when none match."""
    try:
        hub = catalog.parse(name)
    except ValueError as e:
        raise PullError(str(e), 404) from None
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    url = endpoint()
    with _hub_errors(hub.repo, url):
        tree = list(HfApi(endpoint=url).list_repo_tree(hub.repo, recursive=True, revision=REVISION))
    files = [RemoteFile(f.path, f.size, f.lfs.sha256 if f.lfs else "", f.blob_id) for f in tree
             if isinstance(f, RepoFile) and f.path.lower().endswith(".gguf")
             and ".." not in f.path.split("/") and not f.path.startswith("/")]
    if projector:
        return Plan(HubName(hub.repo, PROJECTOR_TAG), (choose_projector(files, hub),), url)
    ggufs = [f for f in files if "mmproj" not in f.path.lower()]
    chosen, tag = choose(ggufs, hub)
    return Plan(HubName(hub.repo, tag), tuple(chosen), url)


def choose_projector(files: list[RemoteFile], hub: HubName) -> RemoteFile:
    """The repository's vision projector: the file the tag names, else by `PROJECTOR_TYPES`, else the smallest."""
    projectors = [f for f in files if "mmproj" in f.path.lower()]
    if not projectors:
        raise PullError(f"{hub.repo} has no vision projector (an mmproj GGUF): its model reads text only", 404)
    if hub.tag and hub.tag.lower().endswith(".gguf"):
        named = [f for f in projectors if hub.tag.lower() in (f.path.lower(), f.path.rsplit("/", 1)[-1].lower())]
        if named:
            return named[0]
    for kind in PROJECTOR_TYPES:
        typed = [f for f in projectors if f.quant == kind]
        if typed:
            return min(typed, key=lambda f: f.size)
    return min(projectors, key=lambda f: f.size)


def fetch(chosen: Plan, models: Path, report: Callable[[Step], None] = lambda step: None,
          cancel: threading.Event | None = None) -> LocalModel:
    """Download what `chosen` names (what is there already is kept), check it and record the model."""
    chosen = dataclasses.replace(chosen, name=catalog.spelling(models, chosen.name))
    with _hub_errors(chosen.name.repo, chosen.endpoint), _only_puller(models, chosen.name):
        _check_disk(chosen, models)
        for f in chosen.files:
            _fetch(chosen, f, models, report, cancel)
        files = [_place(chosen, f, models) for f in chosen.files]
        report(Step("writing manifest"))
        model = catalog.write_manifest(models, chosen.name, files, {"repo": chosen.name.repo, "revision": REVISION})
        report(Step("success"))
        return model


def choose(ggufs: list[RemoteFile], hub: HubName) -> tuple[list[RemoteFile], str]:
    """The files of the model `hub.tag` names (a quantisation or a file) and the tag to list it by."""
    if not ggufs:
        raise PullError(f"{hub.repo} has no GGUF files (homeai runs GGUF models: look for a repository "
                        f"ending in -GGUF)", 404)
    quants = sorted({f.quant for f in ggufs if f.quant})
    tag = hub.tag or (DEFAULT_QUANT if DEFAULT_QUANT in quants else quants[0] if len(quants) == 1 else None)
    if tag is None and len(ggufs) == 1:
        tag = ggufs[0].path.rsplit("/", 1)[-1]
    if tag is None:
        raise PullError(f"{hub.repo} has several models; name one: {_offer(hub.repo, ggufs, quants)}", 404)
    if tag.lower().endswith(".gguf"):
        matching = [f for f in ggufs if tag.lower() in (f.path.lower(), f.path.rsplit("/", 1)[-1].lower())]
    else:
        tag = tag.upper()
        matching = [f for f in ggufs if f.quant == tag]
    if not matching:
        raise PullError(f"{hub.repo} has no {tag}: it has {_offer(hub.repo, ggufs, quants)}", 404)
    return _whole_model(matching, ggufs, hub.repo), tag


def _whole_model(matching: list[RemoteFile], ggufs: list[RemoteFile], repo: str) -> list[RemoteFile]:
    """One model's files: a single file, or every part of a split one, in order."""
    models = {SPLIT.sub("", f.path) for f in matching}
    if len(models) > 1:
        raise PullError(f"{repo}: more than one file matches; name one of {', '.join(sorted(models))}", 404)
    first = matching[0]
    split = SPLIT.search(first.path)
    if split is None:
        return [first]
    stem, count = SPLIT.sub("", first.path), int(split.group(2))
    parts = sorted((f for f in ggufs if SPLIT.sub("", f.path) == stem), key=lambda f: f.path)
    if len(parts) != count:
        raise PullError(f"{repo}: {stem} is split in {count} parts but the repository has {len(parts)}", 404)
    return parts


def _offer(repo: str, ggufs: list[RemoteFile], quants: list[str]) -> str:
    if quants:
        return ", ".join(f"hf.co/{repo}:{q}" for q in quants)
    return ", ".join(f"hf.co/{repo}:{f.path.rsplit('/', 1)[-1]}" for f in ggufs)


def _check_disk(chosen: Plan, models: Path) -> None:
    """Refuse before downloading when the files cannot fit (what is already there or half there counts)."""
    needed = sum(f.size - _have(chosen, f, models) for f in chosen.files)
    free = shutil.disk_usage(models).free
    if needed + RESERVE_BYTES > free:
        raise PullError(f"not enough disk for {chosen.name}: it needs {needed / 1e9:.2f} GB more, "
                        f"{free / 1e9:.2f} GB are free in {models}", 507)


def _have(chosen: Plan, f: RemoteFile, models: Path) -> int:
    if _already_there(chosen, f, models) or _checked(models, f).exists():
        return f.size
    part = _part(models, f)
    return part.stat().st_size if part.exists() else 0


def _final(chosen: Plan, f: RemoteFile, models: Path) -> Path:
    return models / catalog.HOST / chosen.name.repo / f.path


def _part(models: Path, f: RemoteFile) -> Path:
    """Where a file grows while it downloads."""
    return models / catalog.PARTIAL / f"{f.digest.replace(':', '-')}.part"


def _checked(models: Path, f: RemoteFile) -> Path:
    """Where a whole, checked file waits for the model's other parts."""
    return _part(models, f).with_suffix(".checked")


def _already_there(chosen: Plan, f: RemoteFile, models: Path) -> bool:
    """The file is in place and a manifest says it was checked against this very digest."""
    final = _final(chosen, f, models)
    return final.is_file() and any(
        lf.path == final and lf.digest == f.digest and lf.size == f.size
        for m in catalog.listed(models) for lf in m.files)


def _fetch(chosen: Plan, f: RemoteFile, models: Path, report, cancel) -> None:
    """One file downloaded and checked, unless it is in place or checked already."""
    if not (_already_there(chosen, f, models) or _checked(models, f).exists()):
        part = _download(chosen, f, models, report, cancel)
        report(Step("verifying sha256 digest"))
        _verify(part, f)
        os.replace(part, _checked(models, f))
    report(Step(f"pulling {_short(f)}", f.digest, f.size, f.size))


def _place(chosen: Plan, f: RemoteFile, models: Path) -> LocalFile:
    """A checked file under its name, once every part of the model is whole."""
    final = _final(chosen, f, models)
    if _checked(models, f).exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(_checked(models, f), final)
    return LocalFile(final, f.size, f.digest)


def _download(chosen: Plan, f: RemoteFile, models: Path, report, cancel) -> Path:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    part = _part(models, f)
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    if have > f.size:
        part.unlink()
        have = 0
    url = hf_hub_url(chosen.name.repo, f.path, revision=REVISION, endpoint=chosen.endpoint)
    report(Step(f"pulling {_short(f)}", f.digest, f.size, have))
    try:
        with open(part, "ab") as out:
            http_get(url, _Reporting(out, f, report, cancel), resume_size=have, headers=build_hf_headers(),
                     expected_size=f.size, displayed_filename=f.path, tqdm_class=_Quiet)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            for other in chosen.files:  # the model's other parts too: none of it is kept
                _part(models, other).unlink(missing_ok=True)
                _checked(models, other).unlink(missing_ok=True)
            raise PullError(f"the disk filled up while pulling {chosen.name}; nothing of it was kept", 507) from None
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise PullError(f"cannot write {part}: {e.strerror}", 500) from None
        raise PullError(f"{f.path}: {str(e).splitlines()[0]}; pulling again resumes it", 502) from None
    return part


def _verify(part: Path, f: RemoteFile) -> None:
    """The hub's sha256 (or git blob id); a file that does not match is deleted and refused."""
    digest = hashlib.sha256() if f.sha256 else hashlib.sha1(f"blob {f.size}\0".encode())
    with open(part, "rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != (f.sha256 or f.git_oid):
        part.unlink()
        raise PullError(f"{f.path} is corrupt: its digest is {digest.hexdigest()}, the hub says "
                        f"{f.sha256 or f.git_oid}; it was deleted, pull again", 502)


def _short(f: RemoteFile) -> str:
    return f.digest.split(":", 1)[1][:12]


class _Reporting:
    """The part file as `http_get` writes it: each chunk reported, a cancelled pull stopped between chunks."""

    def __init__(self, out, f: RemoteFile, report, cancel):
        self._out, self._file, self._report, self._cancel = out, f, report, cancel

    def write(self, data: bytes) -> int:
        if self._cancel is not None and self._cancel.is_set():
            raise Cancelled()
        written = self._out.write(data)
        self._out.flush()
        f = self._file
        self._report(Step(f"pulling {_short(f)}", f.digest, f.size, self._out.tell()))
        return written

    def __getattr__(self, name: str):  # tell, seek, truncate: http_get rewinds when a server ignores Range
        return getattr(self._out, name)


class _Quiet(tqdm):
    """http_get's own bar, silenced: the caller shows progress (a bar on the terminal, lines over HTTP)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "disable": True})


@contextlib.contextmanager
def _only_puller(models: Path, name: HubName):
    """One pull from a repository at a time, across processes (the daemon and the CLI): two names of
    one file (its quantisation, its file name) must not write the same part at once."""
    locks = models / catalog.PARTIAL
    try:
        locks.mkdir(parents=True, exist_ok=True)
        lock = open(locks / f"{lock_key(name)}.lock", "w")
    except OSError as e:
        raise PullError(f"cannot write in {models}: {e.strerror}", 500) from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PullError(f"{name} is being pulled already; try again once that pull ends", 409) from None
        yield


def unfinished(models: Path) -> int:
    """Bytes of interrupted pulls waiting in `models/.partial` for the same pull to resume them."""
    return sum(p.stat().st_size for p in (models / catalog.PARTIAL).glob("*") if p.suffix in (".part", ".checked"))


def forget_unfinished(models: Path) -> int:
    """Delete the interrupted pulls' files (their next pull starts over); the bytes freed. Refused
    while any pull runs."""
    with contextlib.ExitStack() as held:
        for path in (models / catalog.PARTIAL).glob("*.lock"):
            lock = held.enter_context(open(path, "a"))
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PullError("a pull is running; try again once it ends", 409) from None
        freed = unfinished(models)
        for path in (models / catalog.PARTIAL).glob("*"):
            if path.suffix in (".part", ".checked"):
                path.unlink()
        return freed


def lock_key(name: HubName) -> str:
    """What one pull at a time is counted by: the repository, in any case."""
    return re.sub(r"[^\w.-]+", "--", name.repo.lower())


@contextlib.contextmanager
def _hub_errors(repo: str, url: str):
    """huggingface_hub's and the network's errors as one line each."""
    import httpx2
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError:
        raise PullError(f"{repo} is gated: accept its terms on {url}/{repo} and set HF_TOKEN", 403) from None
    except errors.RepositoryNotFoundError:
        raise PullError(f"no repository {repo} on {url} (a private one needs HF_TOKEN)", 404) from None
    except errors.RevisionNotFoundError:
        raise PullError(f"{repo} has no branch {REVISION}", 404) from None
    except errors.OfflineModeIsEnabled:
        raise PullError("HF_HUB_OFFLINE is set: nothing can be downloaded", 503) from None
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 502
        if status in (401, 403):
            raise PullError(f"{url} refused the token (HF_TOKEN or `hf auth login`): {status}", 401) from None
        raise PullError(f"{url} answered {status} for {repo}: {str(e).splitlines()[0]}", 502) from None
    except httpx2.TransportError as e:
        raise PullError(f"cannot reach {url}: {type(e).__name__}: {e}", 502) from None
