"""Configuration: a TOML file read once into frozen dataclasses and validated at the edge.

Every key is documented in `config.example.toml`. An unknown key, a wrong type or an
impossible value raises `ConfigError` naming the file and the key; nothing downstream
re-checks. Where the file comes from: `--config FILE`, else `$HOMEAI_CONFIG`, else none
(the embedded defaults).

The package's rooms: `sections.py` (the keys and their defaults), `rules.py` (every check and
its message), and here the file read and parsed into them.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import fields, replace
from typing import Any, get_type_hints

from homeai.config.rules import validate
from homeai.config.sections import (LANE_KEYS, REMOTE_LANES, SECTIONS, AuthConfig, ClientsConfig, Config,
                                    ConfigError, DatabaseConfig, GrammarConfig, JobsConfig, LimitsConfig, ModelConfig,
                                    RemoteConfig, SchedulerConfig, ServerConfig, SpeculativeConfig, SpeechConfig, TtsConfig,
                                    WyomingConfig)
from lanes import DEFAULT_POLICIES, LanePolicy

__all__ = ["AuthConfig", "ClientsConfig", "Config", "ConfigError", "DatabaseConfig", "GrammarConfig", "JobsConfig", "LimitsConfig",
           "ModelConfig", "RemoteConfig", "SchedulerConfig", "ServerConfig", "SpeculativeConfig", "SpeechConfig", "TtsConfig",
           "WyomingConfig", "from_dict", "load", "resolve_path", "validate", "with_overrides"]


def resolve_path(cli_path: str | None) -> str | None:
    """The config file in force: the CLI flag, else $HOMEAI_CONFIG, else none."""
    return cli_path or os.environ.get("HOMEAI_CONFIG") or None


def load(path: str | os.PathLike | None) -> Config:
    """Read and validate a config file; None gives the defaults."""
    if path is None:
        return validate(Config(), "(built-in defaults)")
    source = str(path)
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    return from_dict(raw, source)


def from_dict(raw: dict[str, Any], source: str = "(dict)") -> Config:
    """Build a Config from parsed TOML, naming the file and key of any problem."""
    kwargs: dict[str, Any] = {}
    for section, value in raw.items():
        if section == "lanes":
            kwargs["lanes"] = _lanes(value, source)
        elif section == "remote":
            kwargs["remotes"] = _remotes(value, source)
        elif section in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [{section}] must be a table")
            kwargs[section] = _section(SECTIONS[section], value, section, source)
        else:
            known = ", ".join([*SECTIONS, "lanes", "remote"])
            raise ConfigError(f"{source}: unknown section [{section}] (known: {known})")
    return validate(Config(**kwargs, source=source), source)


def _section(cls: type, values: dict[str, Any], section: str, source: str):
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    out = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{source}: unknown key {section}.{key} (known: {', '.join(sorted(known))})")
        out[key] = _coerce(value, hints[key], f"{section}.{key}", source)
    return cls(**out)


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint == tuple[str, ...]:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
    name = getattr(hint, "__name__", str(hint))
    raise ConfigError(f"{source}: {key} must be {name}, got {type(value).__name__} {value!r}")


def _lanes(value: Any, source: str) -> dict[str, LanePolicy]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [lanes] must be a table of lane tables")
    policies = dict(DEFAULT_POLICIES)
    hints = get_type_hints(LanePolicy)
    for name, overrides in value.items():
        if name not in policies:
            raise ConfigError(f"{source}: unknown lane [lanes.{name}] (known: {', '.join(policies)})")
        if not isinstance(overrides, dict):
            raise ConfigError(f"{source}: [lanes.{name}] must be a table")
        changes = {}
        for key, v in overrides.items():
            if key not in LANE_KEYS:
                raise ConfigError(f"{source}: unknown key lanes.{name}.{key} (known: {', '.join(sorted(LANE_KEYS))})")
            changes[key] = _coerce(v, hints[key], f"lanes.{name}.{key}", source)
        policies[name] = replace(policies[name], **changes)
    return policies


def _remotes(value: Any, source: str) -> dict[str, RemoteConfig]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [remote] must be a table of lane tables, e.g. [remote.summaries]")
    remotes = {}
    for lane, values in value.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [remote] holds one table per lane, e.g. [remote.summaries] with "
                              f"url = ...; {lane!r} is not one")
        if lane not in REMOTE_LANES:
            raise ConfigError(f"{source}: [remote.{lane}]: a remote can serve only the lanes {', '.join(REMOTE_LANES)} "
                              "(voice answers on its socket, indexing feeds the local index)")
        remotes[lane] = _section(RemoteConfig, values, f"remote.{lane}", source)
    return remotes


def with_overrides(cfg: Config, **server: Any) -> Config:
    """The same config with server fields replaced (the CLI's --host/--port), validated again."""
    changes = {k: v for k, v in server.items() if v is not None}
    return validate(replace(cfg, server=replace(cfg.server, **changes)), cfg.source)
