"""EndOfSpeechDetector on real synthesised speech fed in 20 ms frames, as a websocket would."""

from __future__ import annotations

import numpy as np

from homeai.speech.stt import EndOfSpeechDetector

RATE = 16000
FRAME = 2 * RATE * 20 // 1000  # bytes in 20 ms of PCM16


def silence(seconds: float) -> bytes:
    return bytes(2 * round(RATE * seconds))


def frames(pcm: bytes, size: int = FRAME):
    for i in range(0, len(pcm), size):
        yield pcm[i:i + size]


def first_end_s(detector: EndOfSpeechDetector, pcm: bytes, size: int = FRAME) -> float | None:
    """Seconds of audio fed when the detector first fires, or None."""
    fed = 0
    for frame in frames(pcm, size):
        fed += len(frame)
        if detector.feed(frame):
            return fed / (2 * RATE)
    return None


def test_fires_after_the_speech_not_before(utterance):
    speech_s = len(utterance.raw_16k) / (2 * RATE)
    detector = EndOfSpeechDetector()
    ended_at = first_end_s(detector, utterance.raw_16k + silence(1.0))
    assert ended_at is not None, "no end of speech detected"
    assert detector.heard_speech
    assert speech_s < ended_at <= speech_s + 1.0
    assert detector.feed(silence(0.02))  # stays ended until reset


def test_speech_alone_does_not_fire(utterance):
    assert first_end_s(EndOfSpeechDetector(), utterance.raw_16k) is None


def test_a_short_pause_does_not_end_the_utterance(utterance):
    speech_s = len(utterance.raw_16k) / (2 * RATE)
    pcm = utterance.raw_16k + silence(0.3) + utterance.raw_16k + silence(1.0)
    ended_at = first_end_s(EndOfSpeechDetector(), pcm)
    assert ended_at is not None and ended_at > 2 * speech_s + 0.3


def test_silence_never_fires():
    detector = EndOfSpeechDetector()
    assert first_end_s(detector, silence(3.0)) is None
    assert not detector.heard_speech


def test_quiet_noise_never_fires():
    noise = (np.random.default_rng(0).normal(0, 30, 3 * RATE)).astype("<i2").tobytes()
    assert first_end_s(EndOfSpeechDetector(), noise) is None


def test_odd_sized_chunks_and_reset(utterance):
    pcm = utterance.raw_16k + silence(1.0)
    detector = EndOfSpeechDetector()
    in_frames = first_end_s(detector, pcm)
    detector.reset()
    assert not detector.ended and detector.num_samples == 0
    in_odd_chunks = first_end_s(detector, pcm, size=333)
    assert in_odd_chunks is not None and abs(in_odd_chunks - in_frames) < 0.04


def test_min_silence_is_respected(utterance):
    speech_s = len(utterance.raw_16k) / (2 * RATE)
    short = first_end_s(EndOfSpeechDetector(min_silence_ms=300), utterance.raw_16k + silence(1.0))
    default = first_end_s(EndOfSpeechDetector(), utterance.raw_16k + silence(1.0))
    assert short is not None and default is not None
    assert default - short >= 0.35
    assert short > speech_s
