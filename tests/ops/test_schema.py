"""Schemathesis against the server's own OpenAPI schema: no 500s, answers as the schema says.

A real server (uvicorn over the shared runner) and a bounded number of generated examples per
operation (positive and negative data); answers are kept short (`server.max_output_tokens`)
so the generated requests that are valid finish quickly. Every operation is exercised and
every failure reported together. (Schemathesis' lazy pytest loader does not run under pytest
9, so the test drives each operation's Hypothesis strategy itself.)

Run: .venv/bin/python -m pytest tests/ops/test_schema.py
(a deeper run: HOMEAI_SCHEMA_EXAMPLES=100 .venv/bin/python -m pytest tests/ops/test_schema.py)
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.api.conftest import api_config, serve

pytestmark = pytest.mark.model

MAX_EXAMPLES = int(os.environ.get("HOMEAI_SCHEMA_EXAMPLES", "8"))  # per operation and mode
# A 503 in the error shape is a refusal, not a crash: what this test server has not loaded (it is
# handed a runner and no speech model nor voice) or has not started (the job service).
UNAVAILABLE = {"speech_unavailable", "tts_unavailable", "model_loading", "jobs_unavailable"}
# This box reaches no model hub (HF_ENDPOINT points at a closed port below): a pull answers 502, the
# hub's failure in Ollama's error shape, which is a refusal, not a crash.
HUB = "http://127.0.0.1:9"


def no_server_error(ctx, response, case) -> None:
    """No 5xx, other than a 503 refusal in OpenAI's error shape for a part that is not there."""
    if response.status_code < 500:
        return
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if response.status_code == 503 and code in UNAVAILABLE:
        return
    if response.status_code == 502 and case.path == "/api/pull" and "error" in response.json():
        return
    raise AssertionError(f"{case.method} {case.path} answered {response.status_code}: {response.text[:500]}")


CHECKS = [no_server_error, response_schema_conformance]


@pytest.fixture(scope="module")
def server(module_tmp, runner):
    short = {"max_tokens": 4}
    cfg = api_config(module_tmp, server={"max_output_tokens": 4},
                     lanes={"voice": short, "chat": short, "summaries": short})
    with pytest.MonkeyPatch.context() as env, serve(cfg, runner) as s:
        env.setenv("HF_ENDPOINT", HUB)  # a pull fails at once instead of retrying a real hub
        yield s


def exercise(operation, base_url: str, statuses: Counter) -> None:
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case):
            response = case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=120)
            statuses[(operation.label, mode.value, response.status_code)] += 1

        try:
            run()
        except Unsatisfiable:  # nothing to break: an operation without parameters or body
            if mode is GenerationMode.POSITIVE:
                raise


def test_the_api_keeps_to_its_schema(server):
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    failures, statuses = [], Counter()
    for operation in operations:
        try:
            exercise(operation, server.url, statuses)
        except (Exception, BaseExceptionGroup) as exc:  # every operation runs; failures are reported together
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
    generating = ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/embeddings")
    answered = [label for label, mode, status in statuses if status == 200 and label in generating]
    assert answered, f"no generated request reached the model: {sorted(statuses.items())}"


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "tool"}], "repeat_penalty": 5e-324}),
    ("/v1/completions", {"prompt": "Än", "repeat_penalty": 1.3, "top_p": 5e-324, "temperature": 0.7}),
])
def test_what_schemathesis_found_stays_fixed(http, path, body):
    # A repeat penalty other than 1 called llama.cpp's penalties sampler with one argument short: 500.
    r = http.post(path, json={**body, "max_tokens": 2})
    assert r.status_code == 200, r.text
