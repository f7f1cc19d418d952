"""`homeai pull NAME` and `homeai models [list | rm NAME | clean]`: local models, by name, under the data directory.

    homeai pull hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M
    homeai models                      # name, file, size, quantisation, context length, served
    homeai models rm hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M
    homeai models clean                # what interrupted pulls left to resume

Pulling does not change the model the household is served: set `model.path` to the name, then
restart (`homeai/cli.py` wires these parsers into `homeai`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from homeai import catalog
from homeai import config as config_mod
from homeai.gguf_header import context_length, metadata, quantization


def add_model_parsers(subparsers) -> list[argparse.ArgumentParser]:
    pull = subparsers.add_parser("pull", help="download a GGUF model from Hugging Face into the data directory")
    pull.add_argument("name", help="hf.co/<org>/<repo>[:<quantisation or file>], e.g. "
                                   "hf.co/bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M")
    pull.add_argument("--mmproj", action="store_true",
                      help="also fetch the repository's vision projector (images in chats), as <repo>:mmproj")
    pull.set_defaults(func=cmd_pull)
    models = subparsers.add_parser("models", help="local models: list (default) or rm NAME")
    msub = models.add_subparsers(dest="action")
    listing = msub.add_parser("list", help="name, file, size, quantisation, context length, whether it is served")
    rm = msub.add_parser("rm", help="delete a local model's files")
    rm.add_argument("name")
    clean = msub.add_parser("clean", help="delete what interrupted pulls left to resume (models/.partial)")
    models.set_defaults(func=cmd_models)
    for p in (pull, models, listing, rm, clean):
        p.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return [pull, models, listing, rm, clean]


def cmd_pull(cfg: config_mod.Config, args) -> int:
    from homeai.pull import PullError, pull

    bar = _Bar()
    projector = None
    try:
        model = pull(args.name, catalog.folder(cfg.data_dir), bar.report)
        if getattr(args, "mmproj", False):
            projector = pull(args.name, catalog.folder(cfg.data_dir), bar.report, projector=True)
    except PullError as e:
        bar.close()
        print(f"homeai: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        bar.close()
        print(f"homeai: interrupted; `homeai pull {args.name}` again resumes it", file=sys.stderr)
        return 130
    bar.close()
    print(f"pulled {model.name} ({model.size / 1e9:.2f} GB) to {model.path}")
    if projector is not None:
        print(f"pulled {projector.name} ({projector.size / 1e9:.2f} GB) to {projector.path}")
    print(f"to serve it: set model.path = \"{model.name}\""
          + (f" and model.mmproj = \"{projector.name}\"" if projector is not None else "")
          + f" in {_config_name(cfg)} and restart homeai")
    return 0


class _Bar:
    """A pull's progress on the terminal: one bar over all of a model's files, from the first byte."""

    def __init__(self):
        self.bar = None
        self.done: dict[str, int] = {}

    def report(self, step) -> None:
        if step.digest is None and self.bar is None:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(unit="B", unit_scale=True, unit_divisor=1024)
        self.bar.set_description_str(step.status)
        if step.digest is not None:
            self.done[step.digest] = step.completed or 0
            self.bar.total = max(self.bar.total or 0, sum(self.done.values()), step.total or 0)
            self.bar.update(sum(self.done.values()) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_models(cfg: config_mod.Config, args) -> int:
    models = catalog.folder(cfg.data_dir)
    if args.action == "rm":
        try:
            model = catalog.remove(models, args.name)
        except KeyError as e:
            print(f"homeai: {e.args[0]}", file=sys.stderr)
            return 1
        print(f"removed {model.name} ({model.size / 1e9:.2f} GB)")
        return 0
    if args.action == "clean":
        from homeai.pull import PullError, forget_unfinished

        try:
            print(f"deleted {forget_unfinished(models) / 1e9:.2f} GB of interrupted pulls")
        except PullError as e:
            print(f"homeai: {e}", file=sys.stderr)
            return 1
        return 0
    print(table(rows(cfg)))
    _unfinished_note(models)
    return 0


def _unfinished_note(models: Path) -> None:
    from homeai.pull import unfinished

    waiting = unfinished(models)
    if waiting:
        print(f"\n{waiting / 1e9:.2f} GB of interrupted pulls wait in {models / catalog.PARTIAL}: the same "
              f"`homeai pull` resumes them, `homeai models clean` deletes them")


def rows(cfg: config_mod.Config) -> list[dict]:
    """Every local model, and the served ones though they lie elsewhere (a path, the embedded model)."""
    served = _served(cfg)
    listed = [(m.name, m.path, m.size) for m in catalog.listed(catalog.folder(cfg.data_dir))]
    known = {path.resolve() for _, path, _ in listed}
    extra = [(path.name.removesuffix(".gguf"), path, path.stat().st_size) for path in served
             if path.resolve() not in known and path.is_file()]
    out = []
    for name, path, size in listed + extra:
        meta = metadata(path)
        out.append({"name": name, "file": str(path), "size": size, "quantization": quantization(meta),
                    "context_length": context_length(meta), "served": served.get(path.resolve(), "")})
    return out


def table(entries: list[dict]) -> str:
    if not entries:
        return "no local models (`homeai pull hf.co/<org>/<repo>:<quantisation>` fetches one)"
    lines = [f"{'NAME':52} {'SIZE':>9} {'QUANT':8} {'CONTEXT':>8}  SERVED      FILE"]
    for e in entries:
        lines.append(f"{e['name']:52} {e['size'] / 1e9:>7.2f}GB {e['quantization'] or '-':8} "
                     f"{e['context_length'] or '-':>8}  {e['served'] or '-':10}  {e['file']}")
    return "\n".join(lines)


def _served(cfg: config_mod.Config) -> dict[Path, str]:
    """The files the config serves: resolved path -> "yes" or "embeddings"."""
    from homeai.models import embedding_model, generation_model

    out = {}
    try:
        out[generation_model(cfg).resolve()] = "yes"
        embedding = embedding_model(cfg)
    except FileNotFoundError:
        return out
    if embedding is not None:
        out.setdefault(embedding.resolve(), "embeddings")
    return out


def _config_name(cfg: config_mod.Config) -> str:
    return cfg.source if cfg.source != "(built-in defaults)" else "your config (--config or $HOMEAI_CONFIG)"
