"""What one app runs: the store, the model and the engine over it, metrics and the stats writer.

`open()` migrates the store and makes sure the default member exists; `start()` loads the
model in a background thread (so `/healthz` can answer "loading" meanwhile), or at once
when a runner was handed in; `stop()` stops the engine, and closes the runner only when it
loaded it. One `Runtime` per app, kept in `app.state.runtime`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

from homeai.api.metrics import Metrics
from homeai.api.recorder import StatsRecorder
from homeai.config import Config
from homeai.engine.engine import Engine, create_engine
from homeai.store import db
from homeai.store.members import ensure_default_member

log = logging.getLogger("homeai.api")

ALIASES = ("homeai", "default")
STOP_TIMEOUT_S = 30.0  # a step in flight must end before the runner is closed or reused


@dataclasses.dataclass(frozen=True)
class ModelCard:
    id: str  # the GGUF file's name without .gguf
    path: str
    created: int  # the file's modification time, as OpenAI's `created`
    purpose: str  # "generate" or "embed" (one card may do both)


class Runtime:
    def __init__(self, cfg: Config, runner=None):
        self.cfg = cfg
        self.runner = runner
        self.owns_runner = runner is None
        self.engine: Engine | None = None
        self.error: str | None = None
        self.models: dict[str, ModelCard] = {}  # generate and embed
        self.metrics = Metrics(cfg.lanes, self.snapshot)
        self.db = None
        self.sessions = None
        self.recorder: StatsRecorder | None = None
        self._lock = threading.Lock()
        self._closing = False

    # ---- lifecycle -------------------------------------------------------------

    def open(self) -> None:
        url = self.cfg.database_url
        db.migrate(url)
        self.db = db.make_engine(url)
        self.sessions = db.make_sessionmaker(self.db)
        with self.sessions() as session:
            ensure_default_member(session)
        self.recorder = StatsRecorder(self.sessions).start()

    def start(self) -> None:
        if self.runner is not None:
            self._start_engine(self.runner)
        else:
            threading.Thread(target=self._load, name="homeai-load", daemon=True).start()

    def _load(self) -> None:
        from homeai.engine.runner import Runner  # the only llama_cpp importer: load it when needed
        from homeai.models import embedding_model, generation_model

        try:
            runner = Runner(self.cfg.model, generation_model(self.cfg), embedding_model(self.cfg))
        except Exception as exc:
            log.exception("the model could not be loaded")
            self.error = f"the model could not be loaded: {exc}"
            return
        with self._lock:
            if self._closing:
                runner.close()
                return
            self.runner = runner
            self._start_engine(runner)

    def _start_engine(self, runner) -> None:
        # The runner's own contexts bound the scheduler, whatever the config says (tests hand one in).
        engine = create_engine(dataclasses.replace(self.cfg, model=runner.cfg), runner)
        engine.on_finish.append(self.metrics.observe)
        if self.recorder is not None:
            engine.on_finish.append(self.recorder.put)
        self.models = _cards(runner.info)
        self.engine = engine.start()
        log.info("serving %s", self.model_id("generate"))

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            engine, runner = self.engine, self.runner
        if engine is not None:
            engine.stop(timeout=STOP_TIMEOUT_S)
        if self.recorder is not None:
            self.recorder.stop()
        if self.owns_runner and runner is not None:
            runner.close()
        if self.db is not None:
            self.db.dispose()

    # ---- what it serves ------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def snapshot(self) -> dict | None:
        return self.engine.snapshot() if self.engine is not None else None

    def model_id(self, purpose: str) -> str:
        return self.models[purpose].id

    def resolve_model(self, requested: str | None, purpose: str) -> str | None:
        """The id of the model serving `purpose` if `requested` names it (or an alias, or nothing)."""
        served = self.models[purpose].id
        if requested is None or requested in ALIASES:
            return served
        name = requested.removesuffix(".gguf")
        return served if name == served or name == Path(self.models[purpose].path).name else None

    def cards(self) -> list[ModelCard]:
        return list({card.id: card for card in self.models.values()}.values())


def _cards(info) -> dict[str, ModelCard]:
    def card(path: str, purpose: str) -> ModelCard:
        p = Path(path)
        created = int(p.stat().st_mtime) if p.exists() else 0
        return ModelCard(p.name.removesuffix(".gguf"), path, created, purpose)

    generate = card(info.path, "generate")
    embed = generate if info.embed_path == info.path else card(info.embed_path, "embed")
    return {"generate": generate, "embed": embed}
