"""Text to speech: the one module that imports piper.

Owns the piper voice(s) (loaded once from local files, the embedded en_US-joe-medium by
default: nothing is downloaded) and a bounded pool of synthesis threads. A synthesis is opened
for a member (the service's `Caller.key`) at its lane's priority and holds one of the pool's
slots until it is closed (`open`; refused, as that member's own doing or as the pool's,
by `homeai.speech.synthesis_queue`); its texts are spoken through it (`Slot.stream`). Work
waiting on the pool is taken by priority (0 voice, 1 chat, 2 background), then by member share,
then by arrival, one chunk (one of piper's sentences) at a time, so a voice answer's sentence
overtakes a long read-aloud between two chunks and one member's many streams do not crowd out
another's one. Leaving a `stream` (a `break`, a cancelled task, a client gone) stops its
synthesis at the next chunk. Its errors and `embedded_voice()` live in `homeai.speech.base`,
which the rest of homeai imports even when this module cannot be (speech out is optional).

    tts = TextToSpeech(TtsConfig())
    async for pcm in tts.stream("Hello there.", member="alice", priority=1):  # PCM16 LE mono at tts.sample_rate()
        ...
    with tts.open("alice", PRIORITY_VOICE) as slot:  # one answer spoken a sentence at a time
        async for pcm in slot.stream("Its first sentence."):
            ...
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Iterator

import onnxruntime
from piper import PiperConfig, PiperVoice, SynthesisConfig

from homeai.config import TtsConfig
from homeai.speech.base import SpeechModelError, SynthesisBusy, resolve_voice
from homeai.speech.synthesis_queue import PRIORITY_BACKGROUND, PRIORITY_CHAT, PRIORITY_VOICE, Admission, FairQueue

__all__ = ["PRIORITY_BACKGROUND", "PRIORITY_CHAT", "PRIORITY_VOICE", "Slot", "TextToSpeech", "Voice", "load_voice"]
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


class Slot:
    """One synthesis admitted for `member`: its texts are spoken through `stream`, at its priority,
    until `close` gives the slot back (a `with` block closes it)."""

    def __init__(self, pool: TextToSpeech, member: str, priority: int):
        self.pool, self.member, self.priority = pool, member, priority
        self.closed = False

    async def stream(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncIterator[bytes]:
        """`text`'s chunks as the pool makes them; leaving stops its synthesis at the next chunk."""
        if self.closed:
            raise RuntimeError("this synthesis is closed")
        pool = self.pool
        chunks = pool.synthesize(text, voice=voice, speed=speed)  # a generator: the voice is checked on a worker
        pool.voice(voice)  # an unknown voice: KeyError here, before queueing
        job = _Job(chunks=chunks, loop=asyncio.get_running_loop(), queue=asyncio.Queue())
        pool._submit(job, self)
        try:
            while (item := await job.queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            pool._cancel(job)

    def close(self) -> None:
        self.pool._close(self)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


class TextToSpeech:
    """The loaded voice(s), blocking `synthesize`, and `open`/`stream` on a bounded, fair priority pool."""

    def __init__(self, cfg: TtsConfig, *, max_pending: int | None = None):
        self.cfg = cfg
        path = resolve_voice(cfg)
        voice = load_voice(path, cfg.threads)
        self.voices: dict[str, Voice] = {voice.name: voice}
        self.default_voice = voice.name
        self.admission = Admission(max_pending or cfg.max_pending, cfg.max_pending_per_member, cfg.voice_reserve)
        self._queue = FairQueue()
        self._stopping = False
        self._lock = threading.Condition()
        self._workers = [threading.Thread(target=self._work, name=f"tts-{i}", daemon=True)
                         for i in range(cfg.workers)]
        for worker in self._workers:
            worker.start()

    @property
    def num_pending(self) -> int:
        """Syntheses open on the pool (waiting, synthesising, or between two sentences)."""
        return self.admission.num_open

    def pending_of(self, member: str) -> int:
        """`member`'s syntheses open on the pool."""
        with self._lock:
            return self.admission.open_of(member)

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

    def open(self, member: str, priority: int = PRIORITY_BACKGROUND) -> Slot:
        """A slot for `member`'s synthesis; SynthesisOverCap at their own cap, SynthesisBusy when the
        pool has no room for the priority's lane (or is shutting down)."""
        with self._lock:
            if self._stopping:
                raise SynthesisBusy("text to speech is shutting down")
            self.admission.open(member, priority)
        return Slot(self, member, priority)

    async def stream(self, text: str, *, member: str, voice: str | None = None, speed: float = 1.0,
                     priority: int = PRIORITY_BACKGROUND) -> AsyncIterator[bytes]:
        """One text spoken in a synthesis of its own, chunks as they are made (`open`'s refusals)."""
        self.voice(voice)  # an unknown voice: KeyError before a slot is taken
        with self.open(member, priority) as slot:
            async for pcm in slot.stream(text, voice=voice, speed=speed):
                yield pcm

    def close(self) -> None:
        """Finish the work already accepted, then stop the worker threads."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        for worker in self._workers:
            worker.join()

    # ---- the pool

    def _close(self, slot: Slot) -> None:
        with self._lock:
            if not slot.closed:
                slot.closed = True
                self.admission.close(slot.member)

    def _submit(self, job: _Job, slot: Slot) -> None:
        with self._lock:
            if self._stopping:
                raise SynthesisBusy("text to speech is shutting down")
            self._queue.add(job, priority=slot.priority, member=slot.member)
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
            self._queue.drop(job)

    def _next_job(self) -> _Job | None:
        """The most urgent job of the least served member, marked running; None when stopping with nothing left."""
        with self._lock:
            while True:
                job = self._queue.take()
                if job is not None:
                    job.running = True
                    return job
                if self._stopping:
                    return None
                self._lock.wait()

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            made = self._step(job)
            with self._lock:
                job.running = False
                if made:
                    self._queue.charge(job, made)
                if made and not job.cancelled:
                    self._queue.put_back(job)  # its place in its member's line kept
                    self._lock.notify()
                else:
                    self._finish(job)

    def _step(self, job: _Job) -> int:
        """Make and deliver the job's next chunk: its bytes, or 0 once it has no more (or nobody listens)."""
        try:
            chunk = next(job.chunks)
        except StopIteration:
            job.deliver(_END)
            return 0
        except Exception as e:  # piper failing on some text: the stream raises it
            job.deliver(SpeechModelError(f"synthesis failed: {type(e).__name__}: {e}"))
            return 0
        if not job.deliver(chunk):
            return 0
        return max(1, len(chunk))  # what the member was served: an empty chunk still took a turn
