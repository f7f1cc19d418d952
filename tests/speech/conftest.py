"""Fixtures for the speech tests: real audio synthesised with espeak-ng and sox (the speech model,
`stt`, is the session's one: tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import wave
from dataclasses import dataclass
from pathlib import Path

import pytest


SENTENCE = "turn on the kitchen lights please"


@dataclass(frozen=True)
class Utterance:
    wav_22k: bytes  # espeak-ng's own output: 22050 Hz mono PCM16 WAV
    wav_16k: bytes  # the same through sox at 16 kHz
    raw_16k: bytes  # headerless PCM16 little-endian mono at 16 kHz
    raw_22k: bytes  # headerless PCM16 at espeak-ng's 22050 Hz


def run_tool(*args: str) -> None:
    tool = args[0]
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed: the speech tests synthesise real audio with it "
                    f"(Debian/Ubuntu: apt-get install -y espeak-ng sox)", pytrace=False)
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def synthesise(text: str, folder: Path) -> Utterance:
    wav, wav16, raw16 = folder / "out.wav", folder / "out16.wav", folder / "out16.raw"
    run_tool("espeak-ng", "-w", str(wav), text)
    run_tool("sox", str(wav), "-r", "16000", "-c", "1", "-b", "16", "-e", "signed-integer", str(wav16))
    run_tool("sox", str(wav16), "-t", "raw", str(raw16))
    with wave.open(str(wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)
        raw22 = w.readframes(w.getnframes())
    return Utterance(wav.read_bytes(), wav16.read_bytes(), raw16.read_bytes(), raw22)


@pytest.fixture(scope="session")
def utterance(tmp_path_factory) -> Utterance:
    return synthesise(SENTENCE, tmp_path_factory.mktemp("speech"))
