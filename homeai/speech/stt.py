"""Speech to text: the one module that imports faster_whisper.

Owns the Whisper model (loaded once from a local directory, the embedded tiny.en by
default: nothing is downloaded), turning PCM16 or uploaded audio files into a
`Transcript` on a bounded thread pool so the asyncio loop and the engine loop never
wait on it, and `EndOfSpeechDetector`, the server-side end-of-utterance detector
built on the Silero VAD that faster-whisper ships. Its errors, `Transcript` and PCM16
helpers live in `homeai.speech.base`, which the rest of homeai imports even when this
module cannot be (speech is optional).

    stt = SpeechToText(SpeechConfig())
    text = (await stt.transcribe_pcm16_async(pcm, 16000)).text
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

import av
import numpy as np

# CTranslate2 carries its own OpenMP runtime; its wait policy is set with llama.cpp's, before
# either loads, in homeai.threads (imported by homeai/__init__.py).
from faster_whisper import WhisperModel, decode_audio
from faster_whisper.vad import get_vad_model

from homeai.config import SpeechConfig
from homeai.speech.base import (SAMPLE_RATE, AudioError, SpeechBusy, SpeechModelError, Transcript, check_duration,
                                check_pcm16, pcm16_to_float, resolve_model_dir)

T = TypeVar("T")


# ---------------------------------------------------------------- the model and audio files

def load_model(model_dir: Path, cfg: SpeechConfig) -> WhisperModel:
    try:
        return WhisperModel(str(model_dir), device=cfg.device, compute_type=cfg.compute_type,
                            num_workers=cfg.workers, local_files_only=True)
    except (RuntimeError, ValueError, OSError) as e:
        raise SpeechModelError(
            f"cannot load the speech model in {model_dir} (device={cfg.device}, "
            f"compute_type={cfg.compute_type}): {e}") from e


def decode_file(data: bytes, max_s: float) -> np.ndarray:
    """Any container and codec PyAV can read -> float32 mono at 16 kHz."""
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            has_audio = bool(container.streams.audio)
            declared_s = (container.duration or 0) / av.time_base
    except (av.FFmpegError, ValueError, OSError):
        raise AudioError("not an audio file (or a format that cannot be decoded)") from None
    if not has_audio:
        raise AudioError("the file has no audio stream")
    # Refuse from the header when it tells, before decoding hours of audio into memory.
    if declared_s:
        check_duration(round(declared_s * SAMPLE_RATE), SAMPLE_RATE, max_s)
    try:
        return decode_audio(io.BytesIO(data), sampling_rate=SAMPLE_RATE)
    except (av.FFmpegError, ValueError, OSError, IndexError) as e:
        raise AudioError(f"cannot decode the audio: {e}") from None


# ---------------------------------------------------------------- transcription

class SpeechToText:
    """One Whisper model, a bounded pool of worker threads, sync and async entry points."""

    def __init__(self, cfg: SpeechConfig, *, max_pending: int | None = None):
        self.cfg = cfg
        self.model_dir = resolve_model_dir(cfg)
        self.model = load_model(self.model_dir, cfg)
        self.max_pending = max_pending or 4 * cfg.workers
        self._executor = ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="stt")
        self._num_pending = 0
        self._lock = threading.Lock()

    @property
    def num_pending(self) -> int:
        """Jobs queued or running on the pool."""
        return self._num_pending

    def transcribe_pcm16(self, pcm: bytes, sample_rate: int, language: str | None = "en",
                         vad: bool = False, *, beam_size: int = 1,
                         on_segment: Callable[[str], None] | None = None) -> Transcript:
        """Transcribe PCM16 little-endian mono; `vad` drops silences before decoding; `on_segment`
        is called (on this thread) with each segment's text as Whisper finishes it."""
        started = time.perf_counter()
        check_pcm16(pcm, sample_rate)
        check_duration(len(pcm) // 2, sample_rate, self.cfg.max_utterance_s)
        audio = pcm16_to_float(pcm, sample_rate)
        # Greedy by default: on a spoken question latency beats the last bit of accuracy.
        return self._transcribe(audio, language, vad, beam_size, started, on_segment)

    def transcribe_file(self, data: bytes, language: str | None = None, *,
                        beam_size: int = 5) -> Transcript:
        """Transcribe an uploaded file (WAV, MP3, OGG, FLAC, WebM... whatever PyAV decodes)."""
        started = time.perf_counter()
        audio = decode_file(data, self.cfg.max_utterance_s)
        check_duration(audio.size, SAMPLE_RATE, self.cfg.max_utterance_s)
        return self._transcribe(audio, language, False, beam_size, started)

    async def transcribe_pcm16_async(self, pcm: bytes, sample_rate: int, language: str | None = "en",
                                     vad: bool = False, *, beam_size: int = 1,
                                     on_segment: Callable[[str], None] | None = None) -> Transcript:
        return await self._run(lambda: self.transcribe_pcm16(pcm, sample_rate, language, vad,
                                                             beam_size=beam_size, on_segment=on_segment))

    async def transcribe_file_async(self, data: bytes, language: str | None = None, *,
                                    beam_size: int = 5) -> Transcript:
        return await self._run(lambda: self.transcribe_file(data, language, beam_size=beam_size))

    def close(self) -> None:
        """Finish the jobs already accepted, then stop the worker threads."""
        self._executor.shutdown(wait=True)

    def _transcribe(self, audio: np.ndarray, language: str | None, vad: bool,
                    beam_size: int, started: float, on_segment=None) -> Transcript:
        segments, info = self.model.transcribe(
            audio, language=language, beam_size=beam_size, vad_filter=vad,
            # Utterances are short: conditioning on earlier text only invites repetition loops.
            condition_on_previous_text=False)
        # `segments` is a lazy generator: the decoding happens here, on this thread.
        parts = []
        for s in segments:
            parts.append((round(s.start, 2), round(s.end, 2), s.text.strip()))
            if on_segment is not None and parts[-1][2]:
                on_segment(parts[-1][2])
        return Transcript(
            text=" ".join(p[2] for p in parts if p[2]).strip(),
            language=info.language,
            duration_s=round(audio.size / SAMPLE_RATE, 3),
            segments=parts,
            elapsed_ms=round((time.perf_counter() - started) * 1000, 1))

    async def _run(self, job: Callable[[], T]) -> T:
        with self._lock:
            if self._num_pending >= self.max_pending:
                raise SpeechBusy(f"speech to text is busy: {self._num_pending} transcriptions pending")
            self._num_pending += 1
        future = self._executor.submit(job)
        # Counted down when the job itself is done, not when its awaiter gives up: a
        # cancelled await (a client gone) leaves a running job that still holds a worker.
        future.add_done_callback(self._job_done)
        return await asyncio.wrap_future(future)

    def _job_done(self, _future) -> None:
        with self._lock:
            self._num_pending -= 1


# ---------------------------------------------------------------- end of speech

VAD_WINDOW = 512  # samples per Silero step at 16 kHz (32 ms)
VAD_CONTEXT = 64  # samples of the previous window Silero sees in front of each one


class EndOfSpeechDetector:
    """Says when a streamed utterance has ended: speech heard, then `min_silence_ms` of silence.

    Feed PCM16 mono at 16 kHz in chunks of any size. Each 32 ms window costs one Silero
    step (about 0.2 ms on a CPU): the LSTM state is carried from window to window, so
    nothing already seen is run again. Once ended, `feed` keeps answering True and
    ignores audio until `reset()`.
    """

    def __init__(self, min_silence_ms: int = 700, *, min_speech_ms: int = 100,
                 threshold: float = 0.5, neg_threshold: float | None = None):
        self.min_silence_samples = min_silence_ms * SAMPLE_RATE // 1000
        self.min_speech_samples = min_speech_ms * SAMPLE_RATE // 1000
        self.threshold = threshold
        # Hysteresis as in Silero's own segmenter: a dip between the two thresholds
        # does not start a silence, so a soft syllable does not end the utterance.
        self.neg_threshold = max(threshold - 0.15, 0.01) if neg_threshold is None else neg_threshold
        self._session = _silero_session()
        self.reset()

    def reset(self) -> None:
        """Forget everything heard: ready for the next utterance."""
        self._pending = bytearray()
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(VAD_CONTEXT, dtype=np.float32)
        self.num_samples = 0
        self.num_speech_samples = 0
        self.num_silence_samples = 0  # trailing silence after speech
        self.ended = False

    @property
    def heard_speech(self) -> bool:
        return self.num_speech_samples >= self.min_speech_samples

    def feed(self, pcm: bytes) -> bool:
        """Add a chunk; True once the utterance has ended."""
        if self.ended:
            return True
        self._pending += pcm
        num_windows = len(self._pending) // (2 * VAD_WINDOW)
        if num_windows == 0:
            return False
        whole = 2 * VAD_WINDOW * num_windows
        samples = np.frombuffer(bytes(self._pending[:whole]), dtype="<i2").astype(np.float32) / 32768.0
        del self._pending[:whole]
        for window in samples.reshape(num_windows, VAD_WINDOW):
            if self._step(window):
                self.ended = True
                break
        return self.ended

    def _step(self, window: np.ndarray) -> bool:
        prob = self._speech_prob(window)
        self.num_samples += VAD_WINDOW
        if prob >= self.threshold:
            self.num_speech_samples += VAD_WINDOW
            self.num_silence_samples = 0
        elif self.heard_speech and (prob < self.neg_threshold or self.num_silence_samples):
            self.num_silence_samples += VAD_WINDOW
        return self.heard_speech and self.num_silence_samples >= self.min_silence_samples

    def _speech_prob(self, window: np.ndarray) -> float:
        x = np.concatenate([self._context, window])[None, :]
        prob, self._h, self._c = self._session.run(None, {"input": x, "h": self._h, "c": self._c})
        self._context = window[-VAD_CONTEXT:]
        return float(np.asarray(prob).reshape(-1)[-1])


def _silero_session():
    """faster-whisper's cached Silero ONNX session (shared; onnxruntime's run is thread-safe).

    Its batch call starts from a blank state each time, so we step the session ourselves
    with the state carried over; this relies on the single-model export of 1.2.x.
    """
    session = getattr(get_vad_model(), "session", None)
    names = {i.name for i in session.get_inputs()} if session is not None else set()
    if names != {"input", "h", "c"}:
        raise SpeechModelError("this faster-whisper's Silero VAD is not the one expected "
                               "(faster-whisper >= 1.2 is needed for end-of-speech detection)")
    return session
