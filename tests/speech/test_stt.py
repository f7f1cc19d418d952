"""SpeechToText on real synthesised speech: PCM, files, resampling, errors, the async twins."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from homeai.config import SpeechConfig
from homeai.speech.base import (AudioError, SpeechBusy, SpeechModelError, Transcript, embedded_model_dir,
                                pcm16_to_float, resolve_model_dir)


def assert_heard(t: Transcript) -> None:
    words = t.text.lower()
    assert "kitchen" in words and "light" in words, t.text
    assert t.language == "en"
    assert t.segments and t.elapsed_ms > 0
    assert t.duration_s > 1.0 and t.duration_s < 4.0


def test_embedded_model_is_found():
    model_dir = embedded_model_dir()
    assert model_dir is not None and (model_dir / "model.bin").is_file()
    assert resolve_model_dir(SpeechConfig()) == model_dir


def test_a_configured_dir_without_a_model_is_refused(tmp_path):
    with pytest.raises(SpeechModelError, match="no model.bin"):
        resolve_model_dir(SpeechConfig(model=str(tmp_path)))


def test_resampling_keeps_duration():
    pcm = np.zeros(22050, dtype="<i2").tobytes()
    assert pcm16_to_float(pcm, 22050).size == 16000
    assert pcm16_to_float(pcm[:16000], 8000).size == 16000


def test_pcm16_at_16k(stt, utterance):
    t = stt.transcribe_pcm16(utterance.raw_16k, 16000)
    assert_heard(t)
    assert t.text == t.text.strip()


def test_pcm16_at_22050_is_resampled(stt, utterance):
    assert_heard(stt.transcribe_pcm16(utterance.raw_22k, 22050))


def test_pcm16_with_vad_filter(stt, utterance):
    silence = bytes(2 * 16000)
    assert_heard(stt.transcribe_pcm16(silence + utterance.raw_16k + silence, 16000, vad=True))


@pytest.mark.parametrize("which", ["wav_16k", "wav_22k"])
def test_wav_file(stt, utterance, which):
    assert_heard(stt.transcribe_file(getattr(utterance, which)))


def test_odd_length_pcm(stt, utterance):
    with pytest.raises(AudioError, match="even number of bytes"):
        stt.transcribe_pcm16(utterance.raw_16k[:-1], 16000)


@pytest.mark.parametrize("rate", [0, 4000, 96000])
def test_unsupported_sample_rate(stt, utterance, rate):
    with pytest.raises(AudioError, match="sample rate"):
        stt.transcribe_pcm16(utterance.raw_16k, rate)


def test_too_long(stt):
    pcm = bytes(2 * 16000 * 31)
    with pytest.raises(AudioError, match="30 s limit"):
        stt.transcribe_pcm16(pcm, 16000)


def test_empty_pcm(stt):
    with pytest.raises(AudioError, match="no audio"):
        stt.transcribe_pcm16(b"", 16000)


NOT_AUDIO = [b"this is a text file, not audio\n" * 40, b"", b"\x89PNG\r\n\x1a\n" + bytes(64)]


@pytest.mark.parametrize("data", NOT_AUDIO, ids=["text", "empty", "png"])
def test_not_audio_file(stt, data):
    with pytest.raises(AudioError):
        stt.transcribe_file(data)


def test_truncated_wav(stt, utterance):
    with pytest.raises(AudioError):
        stt.transcribe_file(utterance.wav_16k[:30])


def test_async_twins(stt, utterance):
    async def both():
        return await asyncio.gather(stt.transcribe_pcm16_async(utterance.raw_16k, 16000),
                                    stt.transcribe_file_async(utterance.wav_16k))
    for t in asyncio.run(both()):
        assert_heard(t)
    assert stt.num_pending == 0


def test_async_errors_come_through(stt):
    with pytest.raises(AudioError):
        asyncio.run(stt.transcribe_file_async(b"not audio"))


def test_busy_beyond_the_queue_bound(stt, utterance):
    pcm = utterance.raw_16k[: 2 * 16000]  # one second keeps the queued work short

    async def flood():
        jobs = [stt.transcribe_pcm16_async(pcm, 16000) for _ in range(stt.max_pending + 2)]
        return await asyncio.gather(*jobs, return_exceptions=True)
    results = asyncio.run(flood())
    busy = [r for r in results if isinstance(r, SpeechBusy)]
    assert len(busy) == 2
    assert all(isinstance(r, Transcript) for r in results[: stt.max_pending])
    assert stt.num_pending == 0


def test_a_cancelled_await_keeps_its_slot_until_the_job_ends(stt, utterance):
    async def cancel_one():
        task = asyncio.create_task(stt.transcribe_pcm16_async(utterance.raw_16k, 16000))
        await asyncio.sleep(0.05)  # the job is now running on a worker
        task.cancel()
        await asyncio.sleep(0)
        held = stt.num_pending
        while stt.num_pending:
            await asyncio.sleep(0.02)
        return held
    assert asyncio.run(cancel_one()) == 1
