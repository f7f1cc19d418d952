"""Shared fixtures: one loaded SmolLM2 model per test session, and engines over it."""

from __future__ import annotations

import os

import pytest

from homeai.config import from_dict


def small_config(**model):
    """A small, quick configuration over the embedded model (2 threads, as on the CI box)."""
    base = {"n_ctx": 4096, "interactive_n_ctx": 4096, "n_seq_max": 16, "n_batch": 256, "n_threads": min(os.cpu_count() or 2, 4),
            "embed_n_ctx": 1024, "embed_n_seq_max": 16}
    base.update(model)
    return from_dict({"model": base})


@pytest.fixture(scope="session")
def runner():
    from homeai.engine.runner import Runner
    from homeai.models import generation_model

    cfg = small_config()
    loaded = Runner(cfg.model, generation_model(cfg))
    yield loaded
    loaded.close()


@pytest.fixture
def make_engine(runner):
    """Build engines over the shared runner (one at a time); each is stopped after the test."""
    from homeai.engine.engine import Engine
    from homeai.sched.scheduler import SchedulerLimits
    from lanes import DEFAULT_POLICIES

    engines = []

    def build(policies=None, **limits):
        m = runner.cfg
        base = dict(num_cells=m.n_ctx, num_seqs=m.n_seq_max, max_step_tokens=m.n_batch,
                    embed_max_tokens=m.embed_n_ctx, embed_max_seqs=m.embed_n_seq_max,
                    interactive_cells=m.interactive_n_ctx)
        base.update(limits)
        engine = Engine(runner, policies or dict(DEFAULT_POLICIES), SchedulerLimits(**base)).start()
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.stop()
