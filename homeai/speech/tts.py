"""Text to speech: the one module that imports piper.

Owns the piper voice(s) (loaded once from local files, the embedded en_US-joe-medium by
default: nothing is downloaded) and a bounded pool of synthesis threads. Work waiting on the
pool is taken by priority (0 voice, 1 chat, 2 background), then by arrival, one chunk (one of
piper's sentences) at a time, so a voice answer's sentence overtakes a long read-aloud between
two chunks. Leaving a `stream` (a `break`, a cancelled task, a client gone) stops its synthesis
at the next chunk. Its errors and `embedded_voice()` live in `homeai.speech.base`, which the
rest of homeai imports even when this module cannot be (speech out is optional).

    tts = TextToSpeech(TtsConfig())
    async for pcm in tts.stream("Hello there.", priority=1):  # PCM16 LE mono at tts.sample_rate()
        ...
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Iterator

import onnxruntime
from piper import PiperConfig, PiperVoice, SynthesisConfig

from homeai.config import TtsConfig
from homeai.speech.base import SpeechModelError, SynthesisBusy, resolve_voice

PRIORITY_VOICE, PRIORITY_CHAT, PRIORITY_BACKGROUND = 0, 1, 2
_END = object()  # a job's last item on its stream's queue


# ---------------------------------------------------------------- voices

@dataclass(frozen=True)
class Voice:
    name: str  # the .onnx file's stem, e.g. "en_US-joe-medium"
    path: Path
    piper: PiperVoice = field(repr=False)

    @property
    def sample_rate(self) -> int:
        return self.piper.config.sample_rate


def load_voice(path: Path, threads: int) -> Voice:
    """A piper voice on the CPU, its onnxruntime limited to `threads` (0: its own default)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    try:
        with open(f"{path}.json", encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        session = onnxruntime.InferenceSession(str(path), sess_options=options,
                                               providers=["CPUExecutionProvider"])
    except (OSError, ValueError, KeyError, RuntimeError, onnxruntime.capi.onnxruntime_pybind11_state.Fail) as e:
        raise SpeechModelError(f"cannot load the piper voice {path}: {type(e).__name__}: {e}") from e
    return Voice(name=path.name.removesuffix(".onnx"), path=path, piper=PiperVoice(session=session, config=config))


# ---------------------------------------------------------------- the pool's jobs

@dataclass(eq=False)
class _Job:
    """One text's synthesis: its chunks, made one per turn on a worker, go to its stream's queue."""

    chunks: Iterator[bytes]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    running: bool = False
    done: bool = False
    cancelled: bool = False

    def deliver(self, item) -> bool:
        """Hand an item to the stream; False once its event loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
            return True
        except RuntimeError:  # the loop is closed: nobody is listening
            return False


class TextToSpeech:
    """The loaded voice(s), blocking `synthesize`, and `stream` on a bounded priority pool."""

    def __init__(self, cfg: TtsConfig, *, max_pending: int | None = None):
        self.cfg = cfg
        path = resolve_voice(cfg)
        voice = load_voice(path, cfg.threads)
        self.voices: dict[str, Voice] = {voice.name: voice}
        self.default_voice = voice.name
        self.max_pending = max_pending or 8 * cfg.workers
        self._waiting: list[tuple[int, int, _Job]] = []  # (priority, arrival, job): a heap
        self._arrivals = itertools.count()
        self._num_pending = 0
        self._stopping = False
        self._lock = threading.Condition()
        self._workers = [threading.Thread(target=self._work, name=f"tts-{i}", daemon=True)
                         for i in range(cfg.workers)]
        for worker in self._workers:
            worker.start()

    @property
    def num_pending(self) -> int:
        """Streams waiting or synthesising on the pool."""
        return self._num_pending

    def voice(self, name: str | None = None) -> Voice:
        """A loaded voice by name (None: the default); KeyError for one not loaded."""
        return self.voices[name or self.default_voice]

    def sample_rate(self, voice: str | None = None) -> int:
        return self.voice(voice).sample_rate

    def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> Iterator[bytes]:
        """Blocking: PCM16 little-endian mono chunks, one per sentence piper finds in `text`."""
        chosen = self.voice(voice)
        syn = SynthesisConfig(length_scale=chosen.piper.config.length_scale / speed)
        for chunk in chosen.piper.synthesize(text, syn_config=syn):
            yield chunk.audio_int16_bytes

    async def stream(self, text: str, *, voice: str | None = None, speed: float = 1.0,
                     priority: int = PRIORITY_BACKGROUND) -> AsyncIterator[bytes]:
        """`synthesize` on the pool, chunks as they are made; SynthesisBusy when the pool is full."""
        chunks = self.synthesize(text, voice=voice, speed=speed)  # a generator: the voice is checked on a worker
        self.voice(voice)  # an unknown voice: KeyError here, before queueing
        job = _Job(chunks=chunks, loop=asyncio.get_running_loop(), queue=asyncio.Queue())
        self._submit(job, priority)
        try:
            while (item := await job.queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._cancel(job)

    def close(self) -> None:
        """Finish the work already accepted, then stop the worker threads."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        for worker in self._workers:
            worker.join()

    # ---- the pool

    def _submit(self, job: _Job, priority: int) -> None:
        with self._lock:
            if self._stopping:
                raise SynthesisBusy("text to speech is shutting down")
            if self._num_pending >= self.max_pending:
                raise SynthesisBusy(f"text to speech is busy: {self._num_pending} syntheses pending")
            self._num_pending += 1
            heapq.heappush(self._waiting, (priority, next(self._arrivals), job))
            self._lock.notify()

    def _cancel(self, job: _Job) -> None:
        """The stream was left: a waiting job is dropped now, a running one after its chunk."""
        with self._lock:
            job.cancelled = True
            if not job.running:
                self._finish(job)

    def _finish(self, job: _Job) -> None:
        """Called with the lock held."""
        if not job.done:
            job.done = True
            self._num_pending -= 1

    def _next_job(self) -> tuple[int, int, _Job] | None:
        """The most urgent live job, marked running; None when stopping with nothing left."""
        with self._lock:
            while True:
                while self._waiting and self._waiting[0][2].done:
                    heapq.heappop(self._waiting)
                if self._waiting:
                    entry = heapq.heappop(self._waiting)
                    entry[2].running = True
                    return entry
                if self._stopping:
                    return None
                self._lock.wait()

    def _work(self) -> None:
        while (entry := self._next_job()) is not None:
            priority, arrival, job = entry
            more = self._step(job)
            with self._lock:
                job.running = False
                if more and not job.cancelled:
                    heapq.heappush(self._waiting, (priority, arrival, job))  # its place in line kept
                    self._lock.notify()
                else:
                    self._finish(job)

    def _step(self, job: _Job) -> bool:
        """Make and deliver the job's next chunk; False once it has no more (or nobody listens)."""
        try:
            chunk = next(job.chunks)
        except StopIteration:
            job.deliver(_END)
            return False
        except Exception as e:  # piper failing on some text: the stream raises it
            job.deliver(SpeechModelError(f"synthesis failed: {type(e).__name__}: {e}"))
            return False
        return job.deliver(chunk)
