"""A prompt cache per member (issue 26): what one member sent cannot be read back by another
from `cached_tokens`, the prompt tokens a request reads, Ollama's `prompt_eval_*`, `/api/lanes`
or `/metrics`. The probe of the issue: bob sends "My bank PIN is ..."; alice sends the same
sentence with a right and a wrong guess, `max_tokens: 1`. Auth on, a real server, the `openai`
and `ollama` clients.

Each trial has a sentence of its own (a note number). Alice sends it first with a PIN whose
first digit neither guess has, so either guess finds the same prefix of her own in the cache,
up to the PIN; then bob sends his; then alice her two guesses, in turn the right one first:
only bob's cells could tell them apart (with `prompt_cache_shared`, the right guess first reads
bob's whole sentence from the cache). What a request reads (prompt tokens less cached) stands
in for its time to first token, which tests do not time.

Behind a trusted proxy (issue 54) the same probe runs user against user: Open WebUI's people, each
named in `X-OpenWebUI-User-Id`, share the client's tools from each other's cells, and never any of
another user's message; a member who is not the proxy gets none of it.

Run: .venv/bin/python -m pytest tests/security/test_cache_isolation.py
"""

from __future__ import annotations

import random

import httpx
import ollama
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from homeai.api.lanes import COARSE_CELLS
from homeai.config import from_dict
from homeai.engine.engine import scheduler_limits
from homeai.sched.scheduler import Scheduler
from homeai.service import prompts
from lanes import DEFAULT_POLICIES
from tests.api.conftest import TIMEOUT, add_token, api_config

TRIALS = 10
OLLAMA_TRIALS = 4  # through Ollama's API too, each guess first twice
SENTENCE = "Note {n}: my bank PIN is {pin} and my doctor said the blood test came back fine."


def test_the_opt_in_reaches_the_scheduler_and_is_off_by_default():
    for raw, shared in (({}, False), ({"scheduler": {"prompt_cache_shared": True}}, True)):
        limits = scheduler_limits(from_dict(raw, "(test)"))
        assert Scheduler(dict(DEFAULT_POLICIES), limits).pools.settings.shared is shared


@pytest.fixture(scope="module")
def cfg(module_tmp):
    return api_config(module_tmp, auth={"required": True})


@pytest.fixture(scope="module")
def tokens(cfg, server) -> dict[str, str]:
    made = {name: add_token(cfg, name, admin=name == "root") for name in ("alice", "bob", "root")}
    return {**made, "owui": add_token(cfg, "owui", proxy=True)}


@pytest.fixture(scope="module")
def clients(server, tokens):
    made = {name: openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, timeout=TIMEOUT, max_retries=0)
            for name, token in tokens.items()}
    yield made
    for client in made.values():
        client.close()


def http_as(server, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"})


def pins(rng: random.Random) -> tuple[str, str, str]:
    """Bob's PIN, a wrong guess and alice's warm-up: three different first digits."""
    first = rng.sample("123456789", 3)
    return tuple(d + "".join(rng.choice("0123456789") for _ in range(3)) for d in first)


def say(client: openai.OpenAI, n: int, pin: str):
    reply = client.chat.completions.create(model="homeai", max_tokens=1, temperature=0,
                                           messages=[{"role": "user", "content": SENTENCE.format(n=n, pin=pin)}])
    return reply.usage


@pytest.mark.model
def test_the_pin_probe_reads_nothing_of_bobs_prompt(clients):
    rng = random.Random(26)
    for n in range(TRIALS):
        secret, wrong, warm = pins(rng)
        say(clients["alice"], n, warm)
        bob = say(clients["bob"], n, secret)
        guesses = [("right", secret), ("wrong", wrong)]
        if n % 2:
            guesses.reverse()  # neither guess always comes first
        usage = {name: say(clients["alice"], n, pin) for name, pin in guesses}
        right, wrong_ = usage["right"], usage["wrong"]
        assert right.prompt_tokens == wrong_.prompt_tokens == bob.prompt_tokens, "a PIN of as many tokens"
        assert right.prompt_tokens_details.cached_tokens == wrong_.prompt_tokens_details.cached_tokens, (n, usage)
        assert right.prompt_tokens_details.cached_tokens < right.prompt_tokens - 5, "only alice's own prefix"
        read = {name: u.prompt_tokens - u.prompt_tokens_details.cached_tokens for name, u in usage.items()}
        assert read["right"] == read["wrong"], (n, read)


@pytest.mark.model
def test_bobs_own_next_request_still_reads_from_his_cache(clients):
    first = say(clients["bob"], 99, "2468")
    again = say(clients["bob"], 99, "2468")
    assert again.prompt_tokens_details.cached_tokens == first.prompt_tokens - 1


@pytest.mark.model
def test_ollamas_prompt_eval_and_alices_own_figures_tell_the_guesses_apart_no_more(server, tokens, clients):
    """Through Ollama's API: the same prompt_eval_count either way, and the cached tokens alice's
    own `/api/lanes` figures grew by are the same for the right guess and the wrong one."""
    client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {tokens['alice']}"}, timeout=TIMEOUT)
    rng = random.Random(7)
    with http_as(server, tokens["alice"]) as http:
        def cached_so_far() -> int:
            return http.get("/api/lanes").json()["lanes"]["chat"]["prompt_cache"]["cached_tokens"]

        def ask(n: int, pin: str) -> tuple[int, int]:
            """Alice's prompt_eval_count, and how far her own cached tokens grew."""
            before = cached_so_far()
            reply = client.chat(model="homeai", options={"num_predict": 1, "temperature": 0},
                                messages=[{"role": "user", "content": SENTENCE.format(n=n, pin=pin)}])
            return reply.prompt_eval_count, cached_so_far() - before

        for n in range(200, 200 + OLLAMA_TRIALS):
            secret, wrong, warm = pins(rng)
            ask(n, warm)
            say(clients["bob"], n, secret)
            order = [("right", secret), ("wrong", wrong)]
            seen = {name: ask(n, pin) for name, pin in (order if n % 2 else order[::-1])}
            assert seen["right"] == seen["wrong"] and seen["right"][0] > 0, (n, seen)


@pytest.mark.model
def test_lanes_show_a_member_only_their_own_prompt_cache_figures(server, tokens, clients):
    with http_as(server, tokens["alice"]) as alice, http_as(server, tokens["root"]) as root:
        def own() -> dict:
            return alice.get("/api/lanes").json()["lanes"]["chat"]["prompt_cache"]

        before = own()
        usage = [say(clients["alice"], 500 + k, "1357") for k in range(2)]
        after = own()
        assert after["requests"] == before["requests"] + 2
        assert after["prompt_tokens"] == before["prompt_tokens"] + sum(u.prompt_tokens for u in usage)
        assert after["cached_tokens"] == before["cached_tokens"] + sum(u.prompt_tokens_details.cached_tokens
                                                                       for u in usage)
        say(clients["bob"], 600, "9753")
        assert own() == after, "bob's request shows nowhere in alice's view"
        everyone = root.get("/api/lanes").json()
        assert everyone["lanes"]["chat"]["prompt_cache"]["requests"] > after["requests"], "an admin sees the lane's"
        kv = alice.get("/api/lanes").json()["kv"]
        for view in (kv, *kv["caches"].values()):
            assert view["cells_used"] % COARSE_CELLS == 0 and view["cells_cached"] % COARSE_CELLS == 0, view
        assert everyone["kv"]["cells_cached"] > 0


def families(http: httpx.Client) -> set[str]:
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    return {f.name for f in text_string_to_metric_families(r.text)}


@pytest.mark.model
def test_metrics_give_token_counts_to_an_admin_only(server, tokens):
    with http_as(server, tokens["alice"]) as alice, http_as(server, tokens["root"]) as root:
        member, admin = families(alice), families(root)
    counted = {"homeai_prompt_tokens", "homeai_output_tokens", "homeai_prompt_cache_hit_tokens",
               "homeai_prompt_cache_prompt_tokens", "homeai_kv_cells_used", "homeai_prompt_cache_cells"}
    assert counted <= admin
    assert not counted & member and not any(name.startswith("homeai_prompt_cache") for name in member)
    assert {"homeai_requests", "homeai_ttft_seconds", "homeai_queue_depth", "homeai_model_loaded"} <= member


# ---- user against user, behind a trusted proxy (issue 54) -------------------------------------------

USER_HEADER = "X-OpenWebUI-User-Id"
# The client's own tools, sent with every message as Open WebUI sends its 36: its users share them
TOOLS = [{"type": "function", "function": {
    "name": name, "description": description,
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "What to look for."}}}}}
    for name, description in (("search_notes", "Search the household's shared notes."),
                              ("get_current_timestamp", "The date and time now, to the second."))]


@pytest.fixture(scope="module")
def proxy_users(server, tokens):
    made = {user: openai.OpenAI(base_url=f"{server.url}/v1", api_key=tokens["owui"], timeout=TIMEOUT, max_retries=0,
                                default_headers={USER_HEADER: user}) for user in ("ana", "ben")}
    yield made
    for client in made.values():
        client.close()


def client_chat(n: int, pin: str) -> list[dict]:
    return [{"role": "user", "content": SENTENCE.format(n=n, pin=pin)}]


def say_with_tools(client: openai.OpenAI, n: int, pin: str):
    return client.chat.completions.create(model="homeai", max_tokens=1, temperature=0, messages=client_chat(n, pin),
                                          tools=TOOLS).usage


def client_prefix(runner) -> tuple[int, int]:
    """The public and client prefixes of such a chat, as the service renders it (SmolLM2 knows no
    tools: they go in a system prompt, the client's text)."""
    plan = prompts.tool_plan(runner, TOOLS, None)
    prompt = runner.tokenize(prompts.Prompter(runner, plan)(client_chat(0, "1234")))
    return prompt.public_len, prompt.client_len


@pytest.mark.model
def test_a_proxys_users_share_its_tools_and_none_of_each_others_messages(proxy_users, clients, runner):
    public_len, client_len = client_prefix(runner)
    assert public_len < 16 <= client_len  # the tools are the client's, not public
    rng = random.Random(54)
    for n in range(1000, 1000 + TRIALS):
        secret, wrong, warm = pins(rng)
        say_with_tools(proxy_users["ana"], n, secret)
        first = say_with_tools(proxy_users["ben"], n, warm)
        if n == 1000:  # ben's first chat: the client's tools from ana's cells, nothing of hers after them
            assert first.prompt_tokens_details.cached_tokens == client_len, (first, client_len)
        guesses = [("right", secret), ("wrong", wrong)]
        if n % 2:
            guesses.reverse()
        usage = {name: say_with_tools(proxy_users["ben"], n, pin) for name, pin in guesses}
        right, wrong_ = usage["right"], usage["wrong"]
        assert right.prompt_tokens == wrong_.prompt_tokens, "a PIN of as many tokens"
        assert right.prompt_tokens_details.cached_tokens == wrong_.prompt_tokens_details.cached_tokens, (n, usage)
        assert client_len <= right.prompt_tokens_details.cached_tokens < right.prompt_tokens - 5, "ben's own, up to the PIN"
    # a member who is not the proxy sends ana's very chat: only what no member wrote, under the shortest reuse
    outsider = clients["bob"].chat.completions.create(model="homeai", max_tokens=1, temperature=0, tools=TOOLS,
                                                      messages=client_chat(1000 + TRIALS - 1, secret)).usage
    assert outsider.prompt_tokens_details.cached_tokens == 0, outsider
