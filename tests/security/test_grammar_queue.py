"""Grammar checks shared fairly (issue 55, point 4): 8 grammars from alice that each took the full
5 s to be refused delayed bob's new json_schema from 0.37 s to 41.8 s (one checker, one lock, FIFO).
Checks now run per member, one at a time each, on two checker processes, members served in turn, at
most `max_pending_checks_per_member` waiting or running a member (over it: 429 `grammar_busy`), and
a grammar already answered (refused too) is answered from its cache at once. The slow grammars here
are real (nested repeats, refused by the checker for their cost), and a hook holds a check until the
test lets it go, so every assertion is on the order things finish in, never on a time."""

from __future__ import annotations

import threading

import httpx
import pytest

from homeai.engine import grammar_check
from homeai.engine.grammar_check import GrammarBusy, GrammarChecker
from homeai.llama import json_schema_grammar
from tests.security.conftest import TIMEOUT, add_token, post_json

pytestmark = pytest.mark.model

SLOW_S = 4.0  # each slow grammar's timeout (one token of its nested repeats weighs for 0.5-12 s: refused before or at it)
PLAIN = json_schema_grammar({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def slow(letter: str) -> str:
    """A grammar the checker refuses for its cost (a distinct one per letter: answers are kept by text)."""
    return json_schema_grammar({"type": "string", "pattern": f"^(((((([{letter}-z])+)+)+)+)+)+[a-z]{{40}}$"})


class Asked:
    """Checks asked from threads, each finish recorded in order."""

    def __init__(self, checker: GrammarChecker):
        self.checker, self.finished, self.answers, self.threads = checker, [], {}, []
        self.lock = threading.Lock()

    def ask(self, name: str, member: str, text: str, timeout_s: float = SLOW_S) -> None:
        def run():
            answer = self.checker.check(text, "root", timeout_s, member)
            with self.lock:
                self.finished.append(name)
                self.answers[name] = answer

        thread = threading.Thread(target=run, name=f"check-{name}")
        thread.start()
        self.threads.append(thread)

    def pending(self, member: str, n: int) -> None:
        """Wait until `member` has `n` checks waiting or running."""
        until(lambda: self.checker.pending.get(member, 0) == n)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(TIMEOUT)


def until(condition) -> None:
    event = threading.Event()
    for _ in range(int(TIMEOUT / 0.01)):
        if condition():
            return
        event.wait(0.01)
    raise AssertionError("never happened")


def hold(monkeypatch, texts: dict[str, threading.Event]) -> None:
    """Checks of these grammars wait for their event before their process is asked (a test hook)."""
    ask = grammar_check._Worker.ask

    def holding(worker, text, *args):
        if text in texts:
            texts[text].wait(TIMEOUT)
        return ask(worker, text, *args)

    monkeypatch.setattr(grammar_check._Worker, "ask", holding)


@pytest.fixture
def checker(runner):
    made = GrammarChecker(runner.info.path, max_pending=2)
    asked = Asked(made)
    asked.ask("warm-1", "warm-1", 'root ::= "a"', 120.0)  # both processes started before the test's checks
    asked.ask("warm-2", "warm-2", 'root ::= "b"', 120.0)
    asked.join()
    yield made
    made.stop()


def test_bob_is_answered_while_alice_has_slow_checks_and_her_third_is_refused(checker, monkeypatch):
    """alice's first check holds a process (held until bob is answered, then weighed for real), her
    second waits behind it; bob's starts at once on the other process; her third is refused."""
    bob_done = threading.Event()
    hold(monkeypatch, {slow("a"): bob_done})
    asked = Asked(checker)
    asked.ask("alice-1", "alice", slow("a"))
    asked.ask("alice-2", "alice", slow("b"))
    asked.pending("alice", 2)
    with pytest.raises(GrammarBusy, match="at most 2 .*max_pending_checks_per_member"):
        checker.check(slow("c"), "root", SLOW_S, "alice")
    asked.ask("bob", "bob", PLAIN)
    until(lambda: "bob" in asked.finished)
    bob_done.set()
    asked.join()
    assert asked.finished == ["bob", "alice-1", "alice-2"]  # alice's wait behind each other, not in front of bob's
    assert asked.answers["bob"] is None
    assert all(asked.answers[a].startswith("llama.cpp took") for a in ("alice-1", "alice-2"))  # (per token, or in all)


def test_members_take_turns_and_a_refused_grammar_is_answered_from_its_cache(runner, monkeypatch):
    """One process: alice's second check waits for bob's, asked after it, since alice was served last;
    carol's grammar, refused once already, is answered while alice's second still runs."""
    first, second = threading.Event(), threading.Event()
    hold(monkeypatch, {slow("d"): first, slow("e"): second})
    checker = GrammarChecker(runner.info.path, max_pending=2, workers=1)
    try:
        asked = Asked(checker)
        asked.ask("alice-1", "alice", slow("d"))
        until(lambda: checker.running == {"alice"})
        asked.ask("alice-2", "alice", slow("e"))
        asked.pending("alice", 2)
        asked.ask("bob", "bob", PLAIN)
        asked.pending("bob", 1)
        first.set()
        until(lambda: "bob" in asked.finished)
        asked.ask("carol", "carol", slow("d"))  # alice-1's grammar: refused already
        until(lambda: "carol" in asked.finished)
        second.set()
        asked.join()
        assert asked.finished == ["alice-1", "bob", "carol", "alice-2"]
        assert asked.answers["alice-1"] and asked.answers["carol"] == asked.answers["alice-1"]
    finally:
        first.set()
        second.set()
        checker.stop()


def test_a_members_requests_with_one_new_grammar_share_one_check_past_the_cap(checker, monkeypatch):
    """A client's parallel requests with the same new schema (8 of them, the cap 2) share the first's
    check: none is refused, the process is asked once; another member's same grammar is checked apart
    (no member waits behind another's queue by asking for what the other is known to send)."""
    release = threading.Event()
    hold(monkeypatch, {PLAIN: release})
    asked_texts = []
    ask = grammar_check._Worker.ask

    def counting(worker, text, *args):
        asked_texts.append(text)
        return ask(worker, text, *args)

    monkeypatch.setattr(grammar_check._Worker, "ask", counting)
    asked = Asked(checker)
    for i in range(8):
        asked.ask(f"alice-{i}", "alice", PLAIN)
    asked.pending("alice", 1)
    asked.ask("bob", "bob", PLAIN)
    until(lambda: asked_texts.count(PLAIN) == 2)  # bob's own check asked of the other process
    release.set()
    asked.join()
    assert sorted(asked.answers) == sorted([f"alice-{i}" for i in range(8)] + ["bob"])
    assert all(answer is None for answer in asked.answers.values())
    assert asked_texts.count(PLAIN) == 2  # alice's one check and bob's own


# ---- over HTTP: alice's checks held by a hook, bob's answered, alice's third a 429 ---------------


@pytest.fixture
def held(runner, monkeypatch):
    """A fresh checker on the server's runner whose checks of grammars naming `alice-hold` wait for
    the returned event."""
    release = threading.Event()
    ask = grammar_check._Worker.ask

    def holding(worker, text, *args):
        if "alice-hold" in text:
            release.wait(TIMEOUT)
        return ask(worker, text, *args)

    monkeypatch.setattr(grammar_check._Worker, "ask", holding)  # (as `hold`, by a part of the text)
    fresh = GrammarChecker(runner.info.path, max_pending=2)
    monkeypatch.setattr(runner, "grammar_checker", fresh)
    yield release
    release.set()
    fresh.stop()


def schema_request(const: str) -> dict:
    schema = {"type": "object", "properties": {"kind": {"const": const}, "n": {"type": "integer"}}, "required": ["kind"]}
    return {"model": "homeai", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def test_over_http_bob_is_served_while_alice_waits_and_her_third_gets_429(server, cfg, held, runner):
    tokens = {name: add_token(cfg, name) for name in ("alice-q", "bob-q")}
    clients = {name: httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {token}"})
               for name, token in tokens.items()}
    statuses: dict[str, int] = {}

    def post(name: str, member: str, const: str) -> threading.Thread:
        def run():
            statuses[name] = post_json(clients[member], "/v1/chat/completions", schema_request(const)).status_code
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    try:
        alice = [post(f"alice-{i}", "alice-q", f"alice-hold-{i}") for i in (1, 2)]
        until(lambda: runner.grammar_checker.pending.get("alice-q", 0) == 2)
        third = post_json(clients["alice-q"], "/v1/chat/completions", schema_request("alice-hold-3"))
        assert third.status_code == 429, third.text
        error = third.json()["error"]
        assert error["code"] == "grammar_busy" and "at most 2" in error["message"], error
        assert third.headers.get("Retry-After")
        bob = post_json(clients["bob-q"], "/v1/chat/completions", schema_request("bob-new"))
        assert bob.status_code == 200, bob.text  # while alice's two are still held
        assert not statuses and runner.grammar_checker.pending.get("alice-q") == 2
        held.set()
        for thread in alice:
            thread.join(TIMEOUT)
        assert statuses == {"alice-1": 200, "alice-2": 200}
    finally:
        for client in clients.values():
            client.close()


def test_waiting_checks_leave_the_default_threads_to_everyone_else(server, cfg, held, runner):
    """Three members with two held checks each: six waiting threads, as many as the default pool of
    a 2-core box holds (min(32, cores + 4)); the checks wait on threads of their own, so bob's chat
    is still tokenised and answered."""
    holders = [f"holder-{i}" for i in range(3)]
    clients = {name: httpx.Client(base_url=server.url, timeout=TIMEOUT,
                                  headers={"Authorization": f"Bearer {add_token(cfg, name)}"})
               for name in (*holders, "bob-t")}
    threads = []
    try:
        for name in holders:
            for i in (1, 2):
                body = schema_request(f"alice-hold-{name}-{i}")
                threads.append(threading.Thread(target=post_json, args=(clients[name], "/v1/chat/completions", body)))
                threads[-1].start()
        until(lambda: sum(runner.grammar_checker.pending.get(name, 0) for name in holders) == 6)
        bob = post_json(clients["bob-t"], "/v1/chat/completions",
                        {"model": "homeai", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        assert bob.status_code == 200, bob.text
        assert sum(runner.grammar_checker.pending.get(name, 0) for name in holders) == 6  # still held
    finally:
        held.set()
        for thread in threads:
            thread.join(TIMEOUT)
        for client in clients.values():
            client.close()
