"""Grammars tried in a process of their own before the engine thread builds one.

A grammar llama.cpp cannot take may crash it (a stack overflow in its recursive parser), take
minutes to build or to weigh a token, or write its whole text to stderr when refused. So each
new grammar is first built in a checker process (`python -m homeai.engine.runner`, its
`grammar_worker`: the model's vocabulary only, the build in a thread with a 1 MiB stack, smaller
than any of the daemon's) and walked a few
tokens, each weighed against the whole vocabulary, as the engine does when the model's pick is
refused. The answer is why not (a short reason) or None, within `timeout_s`; past it, or if the
process dies, it is killed, restarted for the next check, and the grammar refused. Answers are
kept by the grammar's text (Home Assistant sends the same tools every turn). One check at a time.
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from multiprocessing.connection import Connection

STEPS = 4  # tokens walked after the build, each weighed against the whole vocabulary
STARTUP_S = 120.0  # a fresh checker loads the vocabulary: not counted against a grammar's time
CACHED = 256  # grammars whose answer is kept
OK = ""  # the cached answer for a grammar that passed


class GrammarChecker:
    def __init__(self, model_path: str):
        self.model_path = model_path
        self.answers: OrderedDict[bytes, str] = OrderedDict()
        self.answers_lock = threading.Lock()
        self.lock = threading.Lock()  # one check at a time, one process
        self.process = None
        self.conn = None

    def check(self, text: str, root: str, timeout_s: float) -> str | None:
        """Why llama.cpp cannot take this grammar within `timeout_s` (None: it can). A kept answer
        does not wait for a check in progress."""
        key = hashlib.sha256(f"{root}\0{text}".encode("utf-8", "surrogatepass")).digest()
        answer = self._kept(key)
        if answer is None:
            with self.lock:
                answer = self._kept(key)  # asked meanwhile
                if answer is None:
                    try:
                        self._start()
                    except RuntimeError as e:
                        return str(e)  # not kept: the next request tries again
                    answer = self._ask(text, root, timeout_s)
                    with self.answers_lock:
                        self.answers[key] = answer
                        while len(self.answers) > CACHED:
                            self.answers.popitem(last=False)
        return answer or None

    def _kept(self, key: bytes) -> str | None:
        with self.answers_lock:
            answer = self.answers.get(key)
            if answer is not None:
                self.answers.move_to_end(key)
            return answer

    def _ask(self, text: str, root: str, timeout_s: float) -> str:
        try:
            self.conn.send((text, root, STEPS, timeout_s))
            if self.conn.poll(timeout_s):
                return self.conn.recv()
            reason = f"llama.cpp took more than {timeout_s:g} s to build it and weigh its first tokens"
        except (EOFError, OSError):
            reason = "llama.cpp failed while building it"
        self.stop()
        return reason

    def _start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", "homeai.engine.runner", self.model_path,
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
        """End the checker process (a later check starts another)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            self.conn.close()
        self.process = self.conn = None

