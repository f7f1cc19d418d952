"""What one app runs: the store, the model and the engine over it, metrics and the stats writer.

`open()` migrates the store and makes sure the default member exists; `start()` loads the
model and the speech-to-text model in a background thread (so `/healthz` can answer "loading"
meanwhile), or starts at once over a runner handed in (and a `SpeechToText` if one is handed
in too: tests bring what they need); `stop()` stops the engine, and closes the runner and the
speech models only when it loaded them. Speech is optional: when it cannot load, `stt` stays
None, `stt_error` says why, and chat still serves; speech out (`tts`, piper) the same way. One `Runtime` per app, kept in `app.state.runtime`.

`shutdown()` is the graceful stop before `stop()` (SIGTERM: `homeai.api.shutdown` says what it
does); the runtime also keeps the lanes served by remote servers (`remotes`), the admission
state that shutdown closes, the per-member count of open voice sockets (`websockets`), and the
per-address count of those still waiting for a token (`unauthenticated`).

When the engine dies (`Engine.on_death`), `error` says why (`/healthz` answers 503) and the
`on_fatal` callbacks are called: `homeai.api.shutdown.serve` adds one that stops the server
with a non-zero exit status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import threading
from pathlib import Path

from homeai import catalog
from homeai.api.dispatch import RemoteLanes
from homeai.api.limits import PerMember
from homeai.api.prometheus import Metrics
from homeai.api.recorder import StatsRecorder
from homeai.engine.state import EngineState
from homeai.api.shutdown import Admission
from homeai.config import Config
from homeai.engine.engine import Engine, create_engine
from homeai.engine import usage
from homeai.speech.base import libraries_missing, tts_libraries_missing
from homeai.store import db
from homeai.store.members import ensure_default_member

log = logging.getLogger("homeai.api")

ALIASES = ("homeai", "default")
# An absolute path of two or more parts (not a URL's): "/home/alice/models/x.gguf"
ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])(?:/[^/\s'\"():,;]+)+/([^/\s'\"():,;]+)")
STOP_TIMEOUT_S = 30.0  # a step in flight must end before the runner is closed or reused


@dataclasses.dataclass(frozen=True)
class ModelCard:
    id: str  # the GGUF file's name without .gguf
    path: str
    created: int  # the file's modification time, as OpenAI's `created`
    purpose: str  # "generate" or "embed" (one card may do both)


class Runtime:
    def __init__(self, cfg: Config, runner=None, stt=None, tts=None):
        self.cfg = cfg
        self.runner = runner
        self.owns_runner = runner is None
        self.stt = stt  # homeai.speech.stt.SpeechToText, or None (not loaded, or not loadable)
        self.owns_stt = stt is None
        self.stt_error: str | None = None
        self.tts = tts  # homeai.speech.tts.TextToSpeech, or None (not loaded, or not loadable)
        self.owns_tts = tts is None
        self.tts_error: str | None = None
        self.engine: Engine | None = None
        self.error: str | None = None
        self.models: dict[str, ModelCard] = {}  # generate and embed
        self.metrics = Metrics(cfg.lanes, self.state)
        self.db = None
        self.sessions = None
        self.recorder: StatsRecorder | None = None
        self.remotes = RemoteLanes(cfg)  # lanes answered by remote servers ([remote.<lane>])
        self.admission = Admission()  # closed by `shutdown`: new requests get 503
        self.websockets = PerMember(cfg.server.max_websockets_per_member)  # open voice sockets per member
        self.unauthenticated = PerMember(  # voice sockets still waiting for a token, per client address
            cfg.server.max_unauthenticated_websockets_per_address, "unauthenticated voice sockets",
            "server.max_unauthenticated_websockets_per_address")
        self.on_fatal: list = []  # callables taking the reason, once the engine has died
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
            if self.tts is None and not self.cfg.tts.enabled:
                self._load_tts()  # loads nothing: records why there is no speech out
            self._start_engine(self.runner)
        else:
            threading.Thread(target=self._load, name="homeai-load", daemon=True).start()

    def _load(self) -> None:
        from homeai.llama import Runner  # the only llama_cpp importer: load it when needed
        from homeai.models import embedding_model, generation_model

        try:
            runner = Runner(self.cfg.model, generation_model(self.cfg), embedding_model(self.cfg),
                            grammar=self.cfg.grammar)
        except Exception as exc:
            log.exception("the model could not be loaded")
            self.error = f"the model could not be loaded: {file_names_only(str(exc))}"
            return
        stt = self.stt or self._load_stt()
        tts = self.tts or self._load_tts()
        with self._lock:
            if self._closing:
                runner.close()
                if stt is not None and self.owns_stt:
                    stt.close()
                if tts is not None and self.owns_tts:
                    tts.close()
                return
            self.runner, self.stt, self.tts = runner, stt, tts
            self._start_engine(runner)

    def _load_stt(self):
        reason = libraries_missing()
        if reason is None:
            from homeai.speech.stt import SpeechToText

            try:
                return SpeechToText(self.cfg.speech)
            except Exception as exc:
                reason = str(exc)
        log.warning("speech to text is unavailable: %s", reason)
        self.stt_error = f"speech to text is unavailable: {file_names_only(reason)}"
        return None

    def _load_tts(self):
        reason = "it is disabled (tts.enabled = false)" if not self.cfg.tts.enabled else tts_libraries_missing()
        if reason is None:
            from homeai.speech.tts import TextToSpeech

            try:
                return TextToSpeech(self.cfg.tts)
            except Exception as exc:
                reason = str(exc)
        log.warning("text to speech is unavailable: %s", reason)
        self.tts_error = f"text to speech is unavailable: {file_names_only(reason)}"
        return None

    def _start_engine(self, runner) -> None:
        # The runner's own contexts bound the scheduler, whatever the config says (tests hand one in).
        engine = create_engine(dataclasses.replace(self.cfg, model=runner.cfg), runner)
        engine.on_finish.append(self.metrics.observe)
        usage.of(engine)  # who used the box in the last hour (`/api/lanes`), counted from the start
        engine.on_death.append(self._engine_died)
        if self.recorder is not None:
            engine.on_finish.append(self.recorder.put)
        self.models = _cards(runner.info)
        self.engine = engine.start()
        log.info("serving %s", self.model_id("generate"))

    def _engine_died(self, reason: str) -> None:
        self.error = f"the engine stopped: {file_names_only(reason)}"
        self.admission.engine_error = self.error
        for callback in self.on_fatal:
            callback(self.error)

    async def shutdown(self, grace_s: float = 0.0, *, jobs=None) -> None:
        """The graceful stop (SIGTERM, see `homeai.api.shutdown`): admit nothing more, tell `jobs`
        (a JobService) to stop, give requests in flight `grace_s`, then cut the rest short. Once."""
        if self.admission.draining:
            return
        self.admission.draining = True
        jobs = jobs if jobs is not None else getattr(self, "jobs", None)
        loop = asyncio.get_running_loop()
        stopping_jobs = loop.run_in_executor(None, jobs.shutdown) if jobs is not None else None
        if not await self.admission.wait_idle(grace_s):
            log.info("cutting short %d request(s) still in flight", self.admission.num_inflight)
        if self.engine is not None:  # every stream ends with "abort", every sequence is freed
            await loop.run_in_executor(None, self.engine.stop, STOP_TIMEOUT_S)
        await self.remotes.close()
        if stopping_jobs is not None:
            await stopping_jobs

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            engine, runner, stt, tts = self.engine, self.runner, self.stt, self.tts
        if engine is not None:
            engine.stop(timeout=STOP_TIMEOUT_S)
        if self.owns_stt and stt is not None:
            stt.close()
        if self.owns_tts and tts is not None:
            tts.close()
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

    def state(self) -> EngineState | None:
        return self.engine.state() if self.engine is not None else None

    def model_id(self, purpose: str) -> str:
        return self.models[purpose].id

    def resolve_model(self, requested: str | None, purpose: str) -> str | None:
        """The id of the model serving `purpose` if `requested` names it (or an alias, or nothing, or the
        served file's local name, `hf.co/<org>/<repo>:<quant>`: homeai.catalog)."""
        served = self.models[purpose].id
        alias = self.cfg.clients.model_alias  # `[clients] model_alias`, the household's short name
        if requested is None or requested in ALIASES or (alias and requested == alias):
            return served
        name = requested.removesuffix(".gguf")
        if name == served or name == Path(self.models[purpose].path).name:
            return served
        local = catalog.find(catalog.folder(self.cfg.data_dir), requested)
        named = local is not None and local.path.resolve() == Path(self.models[purpose].path).resolve()
        return served if named else None

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


def file_names_only(reason: str) -> str:
    """`reason` as any client may read it (`/healthz` answers everyone): each absolute path cut to
    its file's name, its folders (a home directory, a user name) left to the log."""
    return ABSOLUTE_PATH.sub(r"\1", reason)
