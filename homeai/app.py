"""The program, assembled in one place: from a Config, the runner, speech in, speech out, the engine,
the service and the jobs; `homeai serve`, the commands that need a model and the benchmarks all
build it here.

    program = Program(cfg)        # nothing loaded: the service answers "loading" meanwhile
    program.open()                # the store migrated, the default member, the jobs (not yet running)
    program.start()               # the models loading in a background thread; the jobs run (a run waits for the model)
    ... program.service ...       # what every protocol and job asks (homeai.service)
    program.stopping_jobs(); await program.stop_engine()   # the graceful stop's part (homeai.api.runtime)
    program.stop()                # whatever it loaded closed

    with loaded(cfg) as program:  # a command's model, loaded now: program.engine, program.runner
        ...

Handed a runner (and a SpeechToText, a TextToSpeech), it serves those (tests bring what they need)
and closes none of them. Speech is optional: when it cannot load, `stt` stays None, `stt_error`
says why, and chat still serves; speech out (`tts`) the same way. When the engine dies, `error`
says why and the `on_fatal` callbacks are called; `on_finish` callbacks are attached to the engine
when it starts (the HTTP side's metrics and stats writer). The lanes served by remote servers
(`remotes`) are the program's too: the service says which lanes they are. The program stands above
the service's clients: `homeai.api`, `homeai.wyoming` and `homeai.jobs` are handed the service,
never the pieces below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import threading
from pathlib import Path

from homeai import catalog
from homeai.config import Config
from homeai.engine import usage
from homeai.engine.engine import Engine, create_engine
from homeai.engine.state import EngineState
from homeai.jobs.service import JobService
from homeai.remote.relay import RemoteLanes
from homeai.service import Service
from homeai.speech.base import libraries_missing, tts_libraries_missing
from homeai.store import db
from homeai.store.members import ensure_default_member

log = logging.getLogger("homeai.app")

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


def load_runner(cfg: Config, *, embeddings: bool = True, grammar: bool = True):
    """The model loaded (the only place a `Runner` is built): with the separate embedding model when
    configured (`embeddings`), and `[grammar]`'s limits (`grammar`; the benchmarks take the defaults)."""
    from homeai.llama import Runner  # the only llama_cpp importer: load it when needed
    from homeai.models import draft_model, embedding_model, generation_model, projector

    return Runner(cfg.model, generation_model(cfg), embedding_model(cfg) if embeddings else None,
                  grammar=cfg.grammar if grammar else None, draft_path=draft_model(cfg), mmproj_path=projector(cfg))


def engine_over(cfg: Config, runner) -> Engine:
    """An engine over a loaded runner, not started: the runner's own contexts bound the scheduler,
    whatever the config says (tests hand one in)."""
    return create_engine(dataclasses.replace(cfg, model=runner.cfg), runner)


class Program:
    def __init__(self, cfg: Config, *, runner=None, stt=None, tts=None):
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
        self.db = None
        self.sessions = None
        self.jobs: JobService | None = None
        self.remotes = RemoteLanes(cfg)  # lanes answered by remote servers ([remote.<lane>])
        self.on_finish: list = []  # engine finish callbacks, attached when it starts
        self.on_stop: list = []  # called once the engine has stopped, before anything is closed
        self.on_fatal: list = []  # callables taking the reason, once the engine has died
        self.service = Service(self)  # what every protocol and job asks of the model
        self._lock = threading.Lock()
        self._closing = False

    # ---- lifecycle -------------------------------------------------------------

    def open(self) -> "Program":
        url = self.cfg.database_url
        db.migrate(url)
        self.db = db.make_engine(url)
        self.sessions = db.make_sessionmaker(self.db)
        with self.sessions() as session:
            ensure_default_member(session)
        self.jobs = JobService(self.cfg, self.service.work, self.sessions)
        self.service.jobs = self.jobs  # documents for `documents: true`
        return self

    def start(self) -> "Program":
        """Load the models in the background (or serve those handed in at once), then run the jobs."""
        if self.runner is not None:
            if self.tts is None and not self.cfg.tts.enabled:
                self._load_tts()  # loads nothing: records why there is no speech out
            self._start_engine(self.runner)
        else:
            threading.Thread(target=self._load, name="homeai-load", daemon=True).start()
        if self.jobs is not None:
            self.jobs.start()
        return self

    def load(self, *, speech: bool = True) -> "Program":
        """Load the model (and with `speech`, speech in and out) now, in this thread: a command's.
        A model that cannot load raises."""
        runner = self.runner if self.runner is not None else load_runner(self.cfg)
        stt = (self.stt or self._load_stt()) if speech else self.stt
        tts = (self.tts or self._load_tts()) if speech else self.tts
        self.runner, self.stt, self.tts = runner, stt, tts
        self._start_engine(runner)
        return self

    def _load(self) -> None:
        try:
            runner = load_runner(self.cfg)
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
        engine = engine_over(self.cfg, runner)
        engine.on_finish.extend(self.on_finish)
        usage.of(engine)  # who used the box in the last hour (`/api/lanes`), counted from the start
        engine.on_death.append(self._engine_died)
        self.models = _cards(runner.info)
        self.engine = engine.start()
        log.info("serving %s", self.model_id("generate"))

    def _engine_died(self, reason: str) -> None:
        self.error = f"the engine stopped: {file_names_only(reason)}"
        for callback in self.on_fatal:
            callback(self.error)

    def stopping_jobs(self) -> asyncio.Future | None:
        """Tell the jobs to stop (in a worker thread: a run ends at its next step); await the future."""
        if self.jobs is None:
            return None
        return asyncio.get_running_loop().run_in_executor(None, self.jobs.shutdown)

    async def stop_engine(self) -> None:
        """Stop the engine: every stream ends with "abort", every sequence is freed."""
        if self.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.stop, STOP_TIMEOUT_S)

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            engine, runner, stt, tts = self.engine, self.runner, self.stt, self.tts
        if engine is not None:
            engine.stop(timeout=STOP_TIMEOUT_S)
        for callback in self.on_stop:
            callback()
        if self.owns_stt and stt is not None:
            stt.close()
        if self.owns_tts and tts is not None:
            tts.close()
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


@contextlib.contextmanager
def loaded(cfg: Config, *, embeddings: bool = False, grammar: bool = False, speech: bool = False,
           store: bool = False):
    """A command's program: the model loaded now (the separate embedding model with `embeddings`,
    `[grammar]`'s limits with `grammar`), its engine started, speech in and out with `speech`, the
    store and the jobs with `store`; everything stopped and closed when the block ends."""
    program = Program(cfg, runner=load_runner(cfg, embeddings=embeddings, grammar=grammar))
    program.owns_runner = True
    try:
        if store:
            program.open()
        program.load(speech=speech)
        yield program
    finally:
        program.stop()


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
