"""Issue 55 point 5: what another member, or an anonymous `metrics_public` scrape, reads from
`/metrics` and `/api/lanes` does not tell the length of bob's answer. Both are read just before
and just after one of bob's chats (the real `openai` client), and every numeric series' change
is compared with his `completion_tokens`: none may land within 2 of it (the ITL histogram's
count moved by `completion_tokens - 1`, the engine's steps by + 1 or 2, before the fix). The
admin's scrape, read around the same chat, still has the full figures.

A real server, auth on. Run: .venv/bin/python -m pytest tests/security/test_access_metrics_lengths.py
"""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import TIMEOUT, add_token, serve, wait_for
from tests.security.conftest import security_config

pytestmark = pytest.mark.model

ANSWER_TOKENS = 24  # bob's answer runs to this cap: long enough that a request's own counts (1) stay far


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return security_config(module_tmp, metrics_public=True, max_output_tokens=ANSWER_TOKENS)


@pytest.fixture(scope="module")
def server(cfg, runner):
    with serve(cfg, runner) as running:
        yield running


@pytest.fixture(scope="module")
def clients(cfg, server):
    """httpx clients by who holds them: the admin, alice (a member), and nobody (no token)."""
    tokens = {"admin": add_token(cfg, "root", admin=True), "alice": add_token(cfg, "alice"), "anonymous": None}
    made = {who: httpx.Client(base_url=server.url, timeout=TIMEOUT,
                              headers={"Authorization": f"Bearer {token}"} if token else {})
            for who, token in tokens.items()}
    yield made
    for client in made.values():
        client.close()


@pytest.fixture(scope="module")
def bob(cfg, server):
    return OpenAI(base_url=server.url + "/v1", api_key=add_token(cfg, "bob"), timeout=TIMEOUT, max_retries=0)


def series(text: str) -> dict[tuple, float]:
    """Every sample of an exposition, by name and labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def numbers(value, path: str = "") -> dict[str, float]:
    """Every number in a JSON document, by its path; times in ms left out (a latency's value in
    ms says how long, not how many, and could meet a token count by chance)."""
    if isinstance(value, dict):
        return {p: v for k, item in value.items() for p, v in numbers(item, f"{path}.{k}").items()}
    if isinstance(value, bool) or not isinstance(value, int | float) or "_ms" in path:
        return {}
    return {path: float(value)}


def scrape(clients) -> dict[str, dict]:
    views = {f"metrics/{who}": series(client.get("/metrics").text) for who, client in clients.items()}
    for who in ("admin", "alice"):  # /api/lanes always needs a token
        views[f"lanes/{who}"] = numbers(clients[who].get("/api/lanes").json())
    return views


def deltas(before: dict, after: dict) -> dict:
    return {key: after[key] - before.get(key, 0.0) for key in after}


def output_tokens(view: dict) -> float:
    return view.get(("homeai_output_tokens_total", (("lane", "chat"),)), 0.0)


@pytest.fixture(scope="module")
def around_bobs_chat(clients, bob):
    """(bob's completion tokens, each view's changes across his chat)."""
    before = scrape(clients)
    reply = bob.chat.completions.create(
        model="homeai", temperature=0.8, seed=1, max_tokens=ANSWER_TOKENS,  # sampled: the tiny model's greedy
        messages=[{"role": "user", "content": "Write a very long story about a lighthouse keeper."}])  # ends soon
    tokens = reply.usage.completion_tokens
    # The metrics are fed once the engine has finished the request, which may be just after the answer.
    wait_for(lambda: output_tokens(series(clients["admin"].get("/metrics").text))
             - output_tokens(before["metrics/admin"]) == tokens)
    return tokens, {view: deltas(before[view], after) for view, after in scrape(clients).items()}


def test_an_answer_long_enough_to_tell_from_a_request(around_bobs_chat):
    tokens, _ = around_bobs_chat
    assert tokens >= 8, "the comparison needs an answer whose length stands apart from per-request counts"


@pytest.mark.parametrize("view", ["metrics/alice", "metrics/anonymous", "lanes/alice"])
def test_no_series_of_a_non_admin_tells_the_answers_length(around_bobs_chat, view):
    tokens, changes = around_bobs_chat
    telling = {key: delta for key, delta in changes[view].items() if abs(delta - tokens) <= 2}
    assert not telling, f"bob's answer had {tokens} tokens; these moved by about as much: {telling}"
    assert changes[view], "the view has series at all"


def test_a_non_admin_still_sees_that_a_request_ran(around_bobs_chat):
    _, changes = around_bobs_chat
    for view in ("metrics/alice", "metrics/anonymous"):
        assert sum(delta for (name, labels), delta in changes[view].items()
                   if name == "homeai_requests_total" and ("lane", "chat") in labels) == 1
        assert changes[view][("homeai_ttft_seconds_count", (("lane", "chat"),))] == 1
    assert changes["lanes/alice"][".lanes.chat.finished"] == 1


def test_the_admin_still_has_the_full_figures(around_bobs_chat):
    tokens, changes = around_bobs_chat
    metrics = changes["metrics/admin"]
    assert metrics[("homeai_output_tokens_total", (("lane", "chat"),))] == tokens
    assert metrics[("homeai_itl_seconds_count", (("lane", "chat"),))] == tokens - 1
    assert tokens <= metrics[("homeai_engine_steps_total", ())] <= tokens + 2
    lanes = changes["lanes/admin"]
    assert tokens <= lanes[".steps"] <= tokens + 2
    assert ".lanes.chat.typical_output_tokens" in lanes and ".kv.entries" in lanes
