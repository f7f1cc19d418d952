"""How many connections the HTTP listener holds, and what is logged when the process runs out of files.

Each connection is a file descriptor, and the process has `RLIMIT_NOFILE` of them (systemd's
LimitNOFILE). Past it nothing opens, neither a member's connection nor the database's file, and
asyncio's accept loop logs "socket.accept() out of system resource" with its traceback once for
each connection waiting in the backlog: 8,300 sockets held by a guest made 395,090 lines (164 MB)
in 40 s (issue 55). So connections are capped below the limit (`Caps`):

* `server.max_connections` in all (0: derived: the soft limit less a quarter of it, at least
  `RESERVE_MIN` kept for the model, the database, Wyoming, speech and logs; at most `CEILING`);
* `server.max_connections_per_address` from one client address (64). Behind a reverse proxy every
  client has the proxy's address, loopback included (no address is exempt: a proxy on loopback is
  one address like any other), so raise it there.

One more connection is closed at once, before a byte of it is read (`Counts.admit`), and the
refusals are logged once a minute with their count. A WebSocket counts in the total as long as
it is open, and leaves its address's count when it is upgraded: the voice socket has caps per
member and per address of its own (`homeai.api.limits`).

Should the limit still be reached (a cap set above it, or files opened elsewhere), `AcceptErrors`
lets one accept error line through a minute, with how many it held back.
"""

from __future__ import annotations

import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass

from homeai.config import ServerConfig

log = logging.getLogger("homeai.api")

RESERVE_MIN = 256  # files kept beside the connections, at least: model, database, Wyoming, speech, logs, pipes
CEILING = 4096  # a derived cap never goes past this: a household needs tens of connections, and each costs memory
REFUSAL_LOG_S = 60.0  # refused connections are logged once in this long, with their count
ACCEPT_LOG_S = 60.0  # accept errors for want of files are logged once in this long, with their count


def file_limit() -> int:
    """The process's soft limit on open files (RLIMIT_NOFILE)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def derived_max_connections(limit: int) -> int:
    """The cap on connections a `server.max_connections` of 0 stands for, under a file limit of `limit`."""
    return max(1, min(CEILING, limit - max(RESERVE_MIN, limit // 4)))


@dataclass(frozen=True)
class Caps:
    max_connections: int
    max_per_address: int
    file_limit: int
    derived: bool  # max_connections came from the file limit (server.max_connections = 0)

    @classmethod
    def of(cls, server: ServerConfig, limit: int | None = None) -> Caps:
        limit = file_limit() if limit is None else limit
        derived = not server.max_connections
        total = derived_max_connections(limit) if derived else server.max_connections
        return cls(total, min(server.max_connections_per_address, total), limit, derived)

    def describe(self) -> str:
        how = "from the file limit" if self.derived else "server.max_connections"
        return (f"{self.max_connections} in all ({how}), {self.max_per_address} per client address, "
                f"under an open-file limit of {self.file_limit}")

    def warning(self) -> str | None:
        """Why the caps do not keep the process below its file limit; None when they do."""
        if self.max_connections + RESERVE_MIN <= self.file_limit:
            return None
        if self.derived:
            return (f"the open-file limit ({self.file_limit}) leaves no room for HTTP connections beside the "
                    f"{RESERVE_MIN} files kept for the model, database and speech: raise it (systemd's "
                    "LimitNOFILE, ulimit -n)")
        return (f"server.max_connections ({self.max_connections}) leaves fewer than {RESERVE_MIN} of the "
                f"{self.file_limit} open files this process may have for the model, database and speech: "
                "lower it, or raise the limit (systemd's LimitNOFILE, ulimit -n)")


class Counts:
    """The open connections by client address, against `Caps`; the listener's event loop alone uses it."""

    def __init__(self, caps: Caps):
        self.caps = caps
        self.by_address: Counter[str] = Counter()
        self._refused = 0
        self._logged = -REFUSAL_LOG_S

    def admit(self, address: str, num_open: int) -> bool:
        """Whether one more connection from `address` may open, `num_open` being open; counted if so."""
        reason = self._over_cap(address, num_open)
        if reason is not None:
            self._note_refusal(address, reason)
            return False
        self.by_address[address] += 1
        return True

    def release(self, address: str) -> None:
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]

    def _over_cap(self, address: str, num_open: int) -> str | None:
        if num_open >= self.caps.max_connections:
            return f"{num_open} connections are open, the most allowed (server.max_connections)"
        if self.by_address[address] >= self.caps.max_per_address:
            return (f"{self.by_address[address]} connections from {address} are open, the most allowed "
                    "(server.max_connections_per_address)")
        return None

    def _note_refusal(self, address: str, reason: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._logged >= REFUSAL_LOG_S:
            log.warning("closed %d connection(s) over the caps in the last %d s, the last from %s: %s",
                        self._refused, REFUSAL_LOG_S, address, reason)
            self._refused, self._logged = 0, now


class AcceptErrors(logging.Filter):
    """On asyncio's logger: of its "socket.accept() out of system resource" lines (one per connection
    waiting in the backlog, each time it retries), one a minute passes, saying how many were held back."""

    def __init__(self):
        super().__init__()
        self.held_back = 0
        self.last = -ACCEPT_LOG_S

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_accept_error(record):
            return True
        now = time.monotonic()
        if now - self.last < ACCEPT_LOG_S:
            self.held_back += 1
            return False
        if self.held_back:
            held = f"{self.held_back} more such lines in the last {now - self.last:.0f} s held back"
            record.msg = f"{record.msg}\n({held})"
        self.held_back, self.last = 0, now
        return True


def _is_accept_error(record: logging.LogRecord) -> bool:
    """asyncio's line for an accept that failed for want of files or memory (selector_events, 3.11-3.13)."""
    return isinstance(record.msg, str) and record.msg.startswith("socket.accept() out of system resource")


_ACCEPT_ERRORS = AcceptErrors()


def limit_accept_errors() -> None:
    """Put `AcceptErrors` on asyncio's logger (once; after logging is configured, which keeps it)."""
    logger = logging.getLogger("asyncio")
    if _ACCEPT_ERRORS not in logger.filters:
        logger.addFilter(_ACCEPT_ERRORS)
