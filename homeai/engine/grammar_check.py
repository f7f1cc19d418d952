"""Grammars tried in processes of their own before the engine thread builds one, shared fairly.

A grammar llama.cpp cannot take may crash it (a stack overflow in its recursive parser), take
minutes to build or to weigh a token, or write its whole text to stderr when refused. So each
new grammar is first built in a checker process (`python -m homeai.llama.grammar_worker`, its
`grammar_worker`: the model's vocabulary only, the build in a thread with a 1 MiB stack, smaller
than any of the daemon's) and walked to where its cost is (`_try_grammar`: walks of up to
`WALK_TOKENS` tokens, toward the grammar's end, each token weighed as the engine weighs it when
the model's pick is refused; one token's weighing past `max_token_ms` refuses it). The answer is
why not (a short reason) or None, within `timeout_s`; past it, or if the process dies, that
process is killed, restarted for the next check, and the grammar refused. Answers are kept by
the grammar's text (Home Assistant sends the same tools every turn), refusals too: a kept answer
is given at once, without waiting for any check.

Checks are shared like the model (issue 55): `WORKERS` processes, each member (the caller's
fair-share key) at most one check running and `max_pending` waiting or running (over it:
`GrammarBusy`, a 429 naming the cap), the next check from the member served longest ago. One
member's slow grammars so wait behind each other, never in front of another's: with two
processes, another member's check starts at once even while one member's runs its full timeout.
A member's requests that bring the same new grammar at once (a client's parallel requests with one
schema) share one check: the first waits its turn, the others wait for its answer and count
against no cap. Another member's same grammar is checked apart, so no member can make another
wait behind their own queue by asking for a grammar the other is known to send.
"""

from __future__ import annotations

import hashlib
import itertools
import socket
import subprocess
import sys
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

WORKERS = 2  # checker processes, each started at its first check (the vocabulary alone: ~70 MB of RSS with SmolLM2)
WALKS = 2  # walks through the grammar, each with its own random choices (for half the timeout at most)
WALK_TOKENS = 128  # tokens a walk goes at most (a walk ends sooner at the grammar's end)
STARTUP_S = 120.0  # a fresh checker loads the vocabulary: not counted against a grammar's time
CACHED = 256  # grammars whose answer is kept
OK = ""  # the cached answer for a grammar that passed


class GrammarBusy(Exception):
    """A member already has `cap` grammar checks waiting or running: the request's, refused at once."""

    def __init__(self, cap: int):
        super().__init__(f"too many new grammars being checked for you at once (at most {cap} waiting or "
                         f"running a member: [grammar] max_pending_checks_per_member); retry when they are answered")
        self.cap = cap


@dataclass
class _Check:
    key: bytes
    text: str
    root: str
    timeout_s: float
    member: str
    worker: _Worker | None = None  # given when its turn comes
    answer: Future = field(default_factory=Future)  # for the member's other requests with this grammar


class GrammarChecker:
    def __init__(self, model_path: str, *, max_pending: int = 2, max_token_ms: float = 400.0, workers: int = WORKERS):
        self.model_path = model_path
        self.max_pending, self.max_token_ms = max_pending, max_token_ms
        self.answers: OrderedDict[bytes, str] = OrderedDict()
        self.answers_lock = threading.Lock()
        self.turn = threading.Condition()  # guards what follows: who waits, who runs, whose turn is next
        self.idle = [_Worker(model_path) for _ in range(workers)]
        self.busy: list[_Worker] = []
        self.queues: dict[str, deque[_Check]] = {}  # per member, checks not started, oldest first
        self.pending: dict[str, int] = {}  # per member, checks waiting or running
        self.running: set[str] = set()  # members with a check running
        self.asked: dict[tuple[str, bytes], _Check] = {}  # per member and grammar, the check waiting or running
        self.served: dict[str, int] = {}  # per member with checks pending, when its last check started
        self.ticks = itertools.count()

    def check(self, text: str, root: str, timeout_s: float, member: str = "") -> str | None:
        """Why llama.cpp cannot take this grammar within `timeout_s` (None: it can). A kept answer is
        given at once; a new grammar waits for `member`'s turn (GrammarBusy: `member` has
        `max_pending` checks already)."""
        key = hashlib.sha256(f"{root}\0{text}".encode("utf-8", "surrogatepass")).digest()
        answer = self._kept(key)
        if answer is not None:
            return answer or None
        check = _Check(key, text, root, timeout_s, member)
        first = self._wait_turn(check)
        if first is not check:  # the member asked for this grammar already: its answer is this one's
            return first.answer.result()
        answer = None
        try:
            answer = self._kept(key)  # answered while it waited (asked twice)
            if answer is None:
                answer = check.worker.ask(text, root, timeout_s, self.max_token_ms)
                if answer is not None:  # (None: the checker did not start; not kept, the next request tries again)
                    self._keep(key, answer)
        finally:
            answer = (answer or None) if answer is not None else "the grammar checker did not start"
            check.answer.set_result(answer)
            self._done(check)
        return answer

    def _wait_turn(self, check: _Check) -> _Check:
        """`check` once its turn has come, or the member's check of the same grammar already asked."""
        with self.turn:
            first = self.asked.get((check.member, check.key))
            if first is not None:
                return first
            if self.pending.get(check.member, 0) >= self.max_pending:
                raise GrammarBusy(self.max_pending)
            self.asked[check.member, check.key] = check
            self.pending[check.member] = self.pending.get(check.member, 0) + 1
            self.queues.setdefault(check.member, deque()).append(check)
            self._dispatch()
            while check.worker is None:
                self.turn.wait()
            return check

    def _dispatch(self) -> None:
        """Give idle processes to the members with a check waiting and none running, the one served
        longest ago first (one not served yet before any; then in the order they came)."""
        while self.idle:
            waiting = [m for m in self.queues if m not in self.running]
            if not waiting:
                break
            member = min(waiting, key=lambda m: self.served.get(m, -1))
            queue = self.queues[member]
            check = queue.popleft()
            if not queue:
                del self.queues[member]
            self.served[member] = next(self.ticks)
            check.worker = self.idle.pop()
            self.busy.append(check.worker)
            self.running.add(member)
        self.turn.notify_all()

    def _done(self, check: _Check) -> None:
        with self.turn:
            del self.asked[check.member, check.key]
            self.busy.remove(check.worker)
            self.idle.append(check.worker)
            self.running.discard(check.member)
            self.pending[check.member] -= 1
            if not self.pending[check.member]:
                del self.pending[check.member]
                self.served.pop(check.member, None)
            self._dispatch()

    def _kept(self, key: bytes) -> str | None:
        with self.answers_lock:
            answer = self.answers.get(key)
            if answer is not None:
                self.answers.move_to_end(key)
            return answer

    def _keep(self, key: bytes, answer: str) -> None:
        with self.answers_lock:
            self.answers[key] = answer
            while len(self.answers) > CACHED:
                self.answers.popitem(last=False)

    def stop(self) -> None:
        """End the checker processes (a later check starts them again)."""
        with self.turn:
            workers = self.idle + self.busy
        for worker in workers:
            worker.stop()


class _Worker:
    """One checker process, started at its first check and after one it was killed for."""

    def __init__(self, model_path: str):
        self.model_path = model_path
        self.process = None
        self.conn = None

    def ask(self, text: str, root: str, timeout_s: float, max_token_ms: float) -> str | None:
        """The process's answer ("" it can), a reason when it took too long or died, None when it did not start."""
        try:
            self._start()
        except RuntimeError:
            return None
        try:
            self.conn.send((text, root, WALKS, WALK_TOKENS, timeout_s, max_token_ms))
            if self.conn.poll(timeout_s):
                return self.conn.recv()
            reason = f"llama.cpp took more than {timeout_s:g} s to build it and weigh its tokens"
        except (EOFError, OSError):
            reason = "llama.cpp failed while building it"
        self.stop()
        return reason

    def _start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", "homeai.llama.grammar_worker", self.model_path,
                                         str(theirs.fileno())], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())
        try:
            ready = self.conn.poll(STARTUP_S) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.stop()
            raise RuntimeError("the grammar checker did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            self.conn.close()
        self.process = self.conn = None
