"""Every check of a configuration and its message: an impossible value raises `ConfigError`
naming the file and the key; nothing downstream re-checks."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from homeai import catalog
from homeai.config.sections import HOST_NAME, REMOTE_LANES, Config, ConfigError, RemoteConfig, WyomingConfig


def _check(ok: bool, source: str, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{source}: {key} {message}")


def validate(cfg: Config, source: str) -> Config:
    """Reject impossible values; return the config unchanged when all hold."""
    s, m, sc = cfg.server, cfg.model, cfg.scheduler
    _check(0 < s.port < 65536, source, "server.port", f"must be 1-65535, got {s.port}")
    _check(s.max_body_bytes >= 1024, source, "server.max_body_bytes", "must be at least 1024")
    _check(s.max_messages >= 1, source, "server.max_messages", "must be at least 1")
    _check(s.max_output_tokens >= 1, source, "server.max_output_tokens", "must be at least 1")
    _check(s.max_ws_message_bytes >= 1024, source, "server.max_ws_message_bytes", "must be at least 1024")
    _check(s.max_websockets_per_member >= 1, source, "server.max_websockets_per_member", "must be at least 1")
    _check(s.max_unauthenticated_websockets_per_address >= 1, source,
           "server.max_unauthenticated_websockets_per_address", "must be at least 1")
    _check(s.shutdown_grace_s >= 0, source, "server.shutdown_grace_s", "must be 0 or more")
    _check(s.header_timeout_s > 0, source, "server.header_timeout_s", "must be positive")
    _check(s.body_timeout_s > 0, source, "server.body_timeout_s", "must be positive")
    _check(s.body_min_rate >= 1, source, "server.body_min_rate", "must be at least 1 (bytes a second)")
    _check(s.max_connections >= 0, source, "server.max_connections", "must be 0 (from the open-file limit) or more")
    _check(s.max_connections_per_address >= 1 and (not s.max_connections or
                                                   s.max_connections_per_address <= s.max_connections),
           source, "server.max_connections_per_address", "must be 1..server.max_connections")
    for name in s.allowed_hosts:
        _check(bool(HOST_NAME.fullmatch(name)), source, "server.allowed_hosts",
               f"must hold host names without scheme or port, like \"homeai.lan\", got {name!r}")
    _check(cfg.auth.required or is_loopback(s.host), source, "auth.required",
           f"may be false only when server.host is a loopback address (host is {s.host!r})")
    _check(m.n_ctx == 0 or m.n_ctx >= 256, source, "model.n_ctx",
           f"must be at least 256 (or 0: from the model), got {m.n_ctx}")
    _check(m.interactive_n_ctx in (-1, 0) or m.interactive_n_ctx >= m.n_batch, source, "model.interactive_n_ctx",
           f"must be -1 (from the model), 0 (one cache) or at least model.n_batch ({m.n_batch}), "
           f"got {m.interactive_n_ctx}")
    _check(0 < m.kv_memory_share <= 1, source, "model.kv_memory_share", f"must be in (0, 1], got {m.kv_memory_share}")
    _check(1 <= m.n_seq_max <= 256, source, "model.n_seq_max", f"must be 1-256, got {m.n_seq_max}")
    _check(m.n_seq_max <= m.n_batch and (m.n_ctx == 0 or m.n_batch <= m.n_ctx), source, "model.n_batch",
           f"must be between model.n_seq_max and model.n_ctx, got {m.n_batch}")
    _check(m.n_threads >= 0, source, "model.n_threads", "must be 0 (all cores) or more")
    _check(m.n_gpu_layers >= -1, source, "model.n_gpu_layers", "must be -1 (all) or more")
    _check(m.flash_attn in ("auto", "on", "off"), source, "model.flash_attn", f"must be auto, on or off, got {m.flash_attn!r}")
    _check(m.cuda_graphs in ("auto", "on", "off"), source, "model.cuda_graphs",
           f"must be auto, on or off, got {m.cuda_graphs!r}")
    _check(m.embed_n_ctx >= 64, source, "model.embed_n_ctx", "must be at least 64")
    _check(1 <= m.embed_n_seq_max <= 256, source, "model.embed_n_seq_max", "must be 1-256")
    for key in ("path", "embedding_path", "mmproj"):
        p = getattr(m, key)
        _check(not p or catalog.resolve(p, catalog.folder(cfg.data_dir)) is not None, source, f"model.{key}",
               f"names no file and no local model: {p} (`homeai models` lists them, `homeai pull` fetches one)")
    _check(sc.w_in > 0 and sc.w_out > 0, source, "scheduler.w_in/w_out", "must be positive")
    _check(0 <= sc.background_min_share < 1, source, "scheduler.background_min_share", "must be in [0, 1)")
    _check(1 <= sc.min_chunk <= m.n_batch, source, "scheduler.min_chunk", "must be 1..model.n_batch")
    _check(sc.max_step_ms > 0, source, "scheduler.max_step_ms", "must be positive")
    _check(sc.plan_ahead in ("auto", "on", "off"), source, "scheduler.plan_ahead", "must be auto, on or off")
    _check(sc.prompt_cache_max_cells >= 0, source, "scheduler.prompt_cache_max_cells", "must be 0 or more")
    _check(0 < sc.member_seq_share <= 1, source, "scheduler.member_seq_share", "must be in (0, 1]")
    sp = cfg.speculative
    _check(1 <= sp.max_draft <= 32, source, "speculative.max_draft", f"must be 1..32, got {sp.max_draft}")
    _check(not sp.draft_path or catalog.resolve(sp.draft_path, catalog.folder(cfg.data_dir)) is not None, source,
           "speculative.draft_path", f"names no file and no local model: {sp.draft_path} (`homeai models` lists them, "
           "`homeai pull` fetches one)")
    unknown = [lane for lane in sp.lanes if lane not in cfg.lanes]
    _check(not unknown, source, "speculative.lanes", f"names no lane: {', '.join(unknown)} (known: {', '.join(cfg.lanes)})")
    lim = cfg.limits
    _check(lim.max_image_bytes >= 1024, source, "limits.max_image_bytes", "must be at least 1024")
    _check(lim.max_image_pixels >= 64 * 64, source, "limits.max_image_pixels", "must be at least 4096 (64 x 64)")
    _check(0 <= lim.max_images <= 64, source, "limits.max_images", f"must be 0..64, got {lim.max_images}")
    g = cfg.grammar
    _check(g.max_token_ms > 0, source, "grammar.max_token_ms", "must be positive")
    _check(g.step_budget_ms > 0, source, "grammar.step_budget_ms", "must be positive")
    _check(g.max_pending_checks_per_member >= 1, source, "grammar.max_pending_checks_per_member", "must be at least 1")
    _check(cfg.speech.device in ("cpu", "cuda", "auto"), source, "speech.device", "must be cpu, cuda or auto")
    _check(cfg.speech.workers >= 1, source, "speech.workers", "must be at least 1")
    _check(cfg.speech.max_utterance_s > 0, source, "speech.max_utterance_s", "must be positive")
    _check(cfg.tts.workers >= 1, source, "tts.workers", "must be at least 1")
    _check(cfg.tts.threads >= 0, source, "tts.threads", "must be 0 (one per core) or more")
    _check(cfg.tts.max_chars >= 1, source, "tts.max_chars", "must be at least 1")
    _check(cfg.tts.max_pending >= 1, source, "tts.max_pending", "must be at least 1")
    _check(1 <= cfg.tts.max_pending_per_member <= cfg.tts.max_pending, source, "tts.max_pending_per_member",
           "must be between 1 and tts.max_pending")
    _check(0 <= cfg.tts.voice_reserve < cfg.tts.max_pending, source, "tts.voice_reserve",
           "must be at least 0 and below tts.max_pending (chat and background need a slot)")
    for name, lane in cfg.lanes.items():
        key = f"lanes.{name}"
        _check(lane.weight > 0, source, f"{key}.weight", "must be positive")
        _check(lane.window_ms >= 0, source, f"{key}.window_ms", "must be 0 or more")
        _check(lane.max_batch >= 1, source, f"{key}.max_batch", "must be at least 1")
        _check(lane.max_queue >= 1, source, f"{key}.max_queue", "must be at least 1")
        _check(lane.ttft_target_ms > 0 and lane.itl_target_ms > 0, source, f"{key} targets", "must be positive")
        _check(0 <= lane.max_tokens <= s.max_output_tokens, source, f"{key}.max_tokens",
               f"must be 0..server.max_output_tokens ({s.max_output_tokens}), got {lane.max_tokens}")
    task_lane = cfg.clients.background_task_lane
    _check(task_lane in ("", *cfg.lanes), source, "clients.background_task_lane",
           f"must be a lane ({', '.join(cfg.lanes)}) or empty, got {task_lane!r}")
    _check(re.fullmatch(r"[A-Za-z0-9-]*", cfg.clients.proxy_user_header) is not None, source,
           "clients.proxy_user_header", f"must be a header name (letters, digits, -) or empty, "
           f"got {cfg.clients.proxy_user_header!r}")
    _check(re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})?", cfg.clients.model_alias) is not None, source,
           "clients.model_alias", f"must be a name of 1-64 letters, digits, . _ - (no ':' or '/') or empty, "
           f"got {cfg.clients.model_alias!r}")
    _validate_jobs(cfg, source)
    _validate_wyoming(cfg.wyoming, source)
    for lane, remote in cfg.remotes.items():
        _validate_remote(remote, f"remote.{lane}", source)
    return cfg


def _validate_remote(r: RemoteConfig, key: str, source: str) -> None:
    parts = urlsplit(r.url)
    _check(parts.scheme in ("http", "https") and bool(parts.hostname), source, f"{key}.url",
           f"must be an http(s) URL like \"http://gpu-box:8700/v1\", got {r.url!r}")
    _check(not parts.query and not parts.fragment, source, f"{key}.url", "must have no query or fragment")
    _check(1 <= r.concurrency <= 1024, source, f"{key}.concurrency", f"must be 1-1024, got {r.concurrency}")
    _check(r.timeout_s > 0, source, f"{key}.timeout_s", f"must be positive, got {r.timeout_s:g}")


def _validate_jobs(cfg: Config, source: str) -> None:
    # Chunk and summary lengths are also capped at run time by what the loaded model allows.
    j = cfg.jobs
    _check(32 <= j.chunk_tokens <= 8192, source, "jobs.chunk_tokens", f"must be 32-8192, got {j.chunk_tokens}")
    _check(0 <= j.chunk_overlap <= j.chunk_tokens // 2, source, "jobs.chunk_overlap",
           f"must be 0..half of jobs.chunk_tokens ({j.chunk_tokens // 2}), got {j.chunk_overlap}")
    max_queue = cfg.lanes["indexing"].max_queue
    _check(1 <= j.embed_batch <= max_queue, source, "jobs.embed_batch",
           f"must be 1..lanes.indexing.max_queue ({max_queue}), got {j.embed_batch}")
    _check(16 <= j.summary_tokens <= 4096, source, "jobs.summary_tokens", f"must be 16-4096, got {j.summary_tokens}")
    _check(j.misfire_grace_s >= 1, source, "jobs.misfire_grace_s", "must be at least 1")
    _check(all(p.strip() for p in j.index_paths), source, "jobs.index_paths", "must not hold empty paths")
    if j.schedule:
        from homeai.cron import parse_schedule  # APScheduler, only when a schedule is set

        try:
            parse_schedule(j.schedule)
        except ValueError as e:
            raise ConfigError(f"{source}: jobs.schedule {e}") from None


def _validate_wyoming(w: WyomingConfig, source: str) -> None:
    _check(0 <= w.port < 65536, source, "wyoming.port", f"must be 0-65535 (0: any free port), got {w.port}")
    _check(1024 <= w.max_frame_bytes <= 64 * 1_048_576, source, "wyoming.max_frame_bytes",
           f"must be 1024..{64 * 1_048_576}, got {w.max_frame_bytes}")
    _check(w.max_connections >= 1, source, "wyoming.max_connections", "must be at least 1")
    _check(1 <= w.max_connections_per_address <= w.max_connections, source, "wyoming.max_connections_per_address",
           "must be 1..wyoming.max_connections")
    _check(w.max_audio_bytes >= 2, source, "wyoming.max_audio_bytes", "must be at least 2 (one PCM16 sample)")
    for entry in w.allow_from:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(f"{source}: wyoming.allow_from must hold addresses or networks like "
                              f"\"192.168.1.20\" or \"10.0.0.0/24\", got {entry!r}") from None
    _check(bool(w.allow_from) or is_loopback(w.host), source, "wyoming.allow_from",
           f"must name the clients allowed when wyoming.host is not a loopback address (host is {w.host!r}): "
           "Wyoming has no authentication")
    _check(not (w.zeroconf and is_loopback(w.host)), source, "wyoming.zeroconf",
           f"advertises the listener on the LAN, but wyoming.host is loopback ({w.host!r}): nobody could reach it")
    _check(bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 -]{0,62}", w.zeroconf_name)), source, "wyoming.zeroconf_name",
           f"must be 1-63 letters, digits, spaces or '-', got {w.zeroconf_name!r}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
